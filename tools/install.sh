#!/bin/bash
# tools/install.sh - the file work of make install and make uninstall (install.mk builds what it copies):
#   tools/install.sh install DESTDIR PREFIX DEVICE...   DEVICE: cpu, cuda (the runtimes install.mk built)
#   tools/install.sh uninstall DESTDIR PREFIX
#
# Files go under DESTDIR/PREFIX.  The installed tools find each other and the runtime from their own
# path (compiler/rtpath.c), never from PREFIX as given here, so a tree staged under DESTDIR works once
# it is unpacked at PREFIX.  PREFIX/lib/pipecc/MANIFEST lists every file install wrote and every
# directory it created, relative to PREFIX, as it goes (an install cut short is still undone by
# uninstall); uninstall removes exactly those, a directory only once it is empty, and refuses a
# manifest with a line that would reach outside PREFIX.  Installing over an earlier install first
# removes that one's files, so none of an older version stays behind.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "make $ACTION: error: $*" >&2; exit 1; }

ACTION=${1:-}
[ $# -ge 3 ] || { ACTION=install; die "usage: tools/install.sh install|uninstall DESTDIR PREFIX [DEVICE...]"; }
DESTDIR=$2 PREFIX=$3
shift 3
# The generated Makefiles name the runtime by its absolute path, unquoted (make cannot quote it).
case $PREFIX in
  /*) ;;
  *) die "PREFIX=$PREFIX: must be an absolute path (the installed pipecc's generated Makefiles name its runtime by it)" ;;
esac
[[ $PREFIX =~ ^[A-Za-z0-9/._+-]+$ ]] ||
  die "PREFIX=$PREFIX: only letters, digits and / . _ + - (the generated Makefiles name the runtime by this path, and make splits it at spaces)"
ROOT=${DESTDIR}${PREFIX}
ROOT=${ROOT%/}
ROOT=${ROOT:-/} # PREFIX=/ with no DESTDIR: the root itself (paths below are joined with a /, so // at worst)
LIB=lib/pipecc
MAN=$ROOT/$LIB/MANIFEST

# Checks every line of MANIFEST before anything is removed: "file PATH" or "dir PATH", PATH relative to
# PREFIX with no '..' component.
check_manifest() {
  local n=0 kind path
  while read -r kind path; do
    n=$((n + 1))
    case $kind in file|dir) ;; *) die "$MAN line $n: '$kind $path': expected 'file PATH' or 'dir PATH'; nothing removed" ;; esac
    if [[ -z $path || $path == /* || /$path/ == */../* || ! $path =~ ^[A-Za-z0-9/._+-]+$ ]]; then
      die "$MAN line $n: '$path' is not a path inside PREFIX; nothing removed"
    fi
  done <"$MAN"
}

# Removes the manifest's files (and the manifest); prints how many.
remove_files() {
  local kind path n=0
  while read -r kind path; do
    if [ "$kind" = file ] && { [ -e "$ROOT/$path" ] || [ -L "$ROOT/$path" ]; }; then rm -f "$ROOT/$path"; n=$((n + 1)); fi
  done <"$MAN"
  rm -f "$MAN"
  echo "$n"
}

# Creates REL's missing directories under ROOT, each recorded as ours.
made_dirs=()
mkdirs() {
  local rel=$1 part= c
  local IFS=/
  for c in $rel; do
    part=${part:+$part/}$c
    if [ ! -d "$ROOT/$part" ]; then
      mkdir "$ROOT/$part" || die "cannot create $ROOT/$part"
      made_dirs+=("$part")
      [ -f "$MAN" ] && echo "dir $part" >>"$MAN"
    fi
  done
  return 0
}

# put MODE SRC REL: SRC installed as ROOT/REL, recorded.
put() {
  mkdirs "$(dirname "$3")"
  install -m "$1" "$2" "$ROOT/$3" || die "cannot install $ROOT/$3"
  echo "file $3" >>"$MAN"
}

do_install() {
  local devices=("$@") d f old_dirs=()
  for d in "${devices[@]}"; do
    [ -f "build/install/$d/prebuilt.mk" ] || die "build/install/$d/prebuilt.mk is missing (make install builds it; run make install, not this script)"
  done
  mkdir -p "$ROOT" || die "cannot create $ROOT"
  if [ -f "$MAN" ]; then  # an earlier install: its files go, the directories it created stay recorded
    check_manifest
    mapfile -t old_dirs < <(sed -n 's/^dir //p' "$MAN")
    echo "make install: removed the $(remove_files) files of the earlier install under $ROOT"
  fi
  mkdirs "$LIB"
  # ${a[@]+...}: an empty array under set -u is an error in bash before 4.4 (CentOS 7's 4.2)
  { for d in ${old_dirs[@]+"${old_dirs[@]}"} ${made_dirs[@]+"${made_dirs[@]}"}; do echo "dir $d"; done; } | awk '!seen[$0]++' >"$MAN"
  for f in pipecc pipecc-probe pipecc-opprobe pipecc-trace piperun-data; do put 755 "bin/$f" "bin/$f"; done
  # The runtime's headers and lists, which the stage programs include (templates/Makefile.in), and
  # protobuf-c's onnx.pb-c.h, which its PIPECC_GEN names.
  for f in runtime/*.h runtime/*.def runtime/cpu/*.h; do put 644 "$f" "$LIB/$f"; done
  put 644 build/gen/onnx.pb-c.h "$LIB/runtime/onnx.pb-c.h"
  put 644 build/install/cpu/libpiperun.a "$LIB/runtime/libpiperun.a"
  put 644 build/install/cpu/prebuilt.mk "$LIB/runtime/prebuilt-cpu.mk"
  if [[ " ${devices[*]} " == *" cuda "* ]]; then
    for f in runtime/cuda/*.h; do put 644 "$f" "$LIB/$f"; done
    put 755 build/install/cuda/libpiperun-cuda.so "$LIB/runtime/libpiperun-cuda.so"
    put 644 build/install/cuda/prebuilt.mk "$LIB/runtime/prebuilt-cuda.mk"
  fi
  put 644 README.md share/doc/pipecc/README.md
  for f in docs/*.md; do put 644 "$f" "share/doc/pipecc/$f"; done
  echo "make install: $(grep -c '^file ' "$MAN") files under $ROOT (runtime: ${devices[*]}); make uninstall PREFIX=$PREFIX${DESTDIR:+ DESTDIR=$DESTDIR} removes them"
}

do_uninstall() {
  [ -f "$MAN" ] || die "no pipecc is installed under $ROOT ($MAN is missing)"
  check_manifest
  local dirs=() kept=() n i
  mapfile -t dirs < <(sed -n 's/^dir //p' "$MAN")
  n=$(remove_files)
  # Deepest first: each directory's children were recorded after it.
  for ((i = ${#dirs[@]} - 1; i >= 0; i--)); do
    [ -d "$ROOT/${dirs[i]}" ] || continue
    rmdir "$ROOT/${dirs[i]}" 2>/dev/null || kept+=("$ROOT/${dirs[i]}")
  done
  echo "make uninstall: removed $n files and $((${#dirs[@]} - ${#kept[@]})) directories from $ROOT"
  for d in ${kept[@]+"${kept[@]}"}; do echo "make uninstall: kept $d: it holds files pipecc did not install"; done
}

case $ACTION in
  install) do_install "$@" ;;
  uninstall) do_uninstall ;;
  *) die "usage: tools/install.sh install|uninstall DESTDIR PREFIX [DEVICE...]" ;;
esac
