#!/bin/bash
# A 4-stage job across two hosts gives the bits it gives on one; so does a job of 2 stages and 2 replicas
# (pipecc --replicas 2: a replica on each host, the weight gradients summed over TCP).
#
# The two hosts are built on this machine: two network namespaces joined by a
# veth pair, each with its own host name (a UTS namespace).  mpirun runs on
# host A; Open MPI reaches host B through an rsh agent that runs its daemon
# with `ip netns exec`, and every byte between the hosts goes over TCP on that
# link.  Host B's environment asks OpenBLAS for other kernels than host A
# runs, as a host with another CPU would get: run.sh must give every rank
# the launching host's kernels.  Needs root (ip netns) for the two hosts: where
# they cannot be made, the single-host run is still checked and the two-host
# checks are counted as skipped, with the reason (tests/tally.sh).
set -u
cd "$(dirname "$0")/.."
root=$(pwd)
. tests/tally.sh   # the one tally's shell copy
ok() { t_ok "$1"; }
bad() { t_notok "$1"; }
finish() { t_finish; exit $?; }

A=pcA$$ B=pcB$$ NET=10.231.7
T=$(mktemp -d "${TMPDIR:-/tmp}/pipecc-hosts.XXXXXX")
cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT

# The job: LeNet over 4 stages (a GEMM-heavy conv net, so the BLAS kernels
# matter), on the built-in data.  Every path is absolute and the run's
# working directory is elsewhere, so a stage that looked for its weights in
# the working directory would not find them.
bin/piperun-data mnist "$T/mnist" --n 1280 --seed 3 >/dev/null
if ! bin/pipecc onnx_models/lenet.onnx -n 4 --batch 32 --microbatches 8 --lr 0.05 -o "$T/lenet.pipe" >/dev/null ||
   ! make -s -C "$T/lenet.pipe" >/dev/null 2>"$T/build.err"; then
  cat "$T/build.err"; bad "compile and build the 4-stage LeNet"; finish
fi
if ! bin/pipecc onnx_models/lenet.onnx -n 2 --replicas 2 --batch 32 --microbatches 4 --lr 0.05 -o "$T/rep.pipe" >/dev/null ||
   ! make -s -C "$T/rep.pipe" >/dev/null 2>"$T/build.err"; then
  cat "$T/build.err"; bad "compile and build LeNet for 2 stages and 2 replicas"; finish
fi
mkdir "$T/wd"
PIPE=lenet.pipe
run() { # run NAME [launcher...]: 12 steps of $PIPE, log and save
  local name=$1; shift
  (cd "$T/wd" && "$@" "$T/$PIPE/run.sh" --data "$T/mnist" --steps 12 --shuffle --quiet --timeout 60 \
     --log "$T/$name.csv" --save "$T/$name.onnx" "${RUNARGS[@]}") >"$T/$name.out" 2>&1
}

# The single-host run needs no namespace: it is checked wherever the two hosts cannot be made.
RUNARGS=()
run one
rc1=$?
[ $rc1 = 0 ] && ok "the single-host run trains" || { bad "the single-host run failed (rc $rc1)"; cat "$T/one.out"; }
PIPE=rep.pipe run rep-one
rcr1=$?
[ $rcr1 = 0 ] && ok "the single-host run of 2 stages x 2 replicas trains" || { bad "the single-host replicas run failed (rc $rcr1)"; cat "$T/rep-one.out"; }
TWO_HOST_CHECKS=("the two-host run trains" "losses are bit-identical on one host and on two"
                 "the trained weights (--save) are bit-identical" "ranks on hosts with other BLAS kernels are refused"
                 "2 stages x 2 replicas on two hosts: the same losses and weights as on one")
skip_two_hosts() { # WHY
  local c
  for c in "${TWO_HOST_CHECKS[@]}"; do t_skip "$c" "$1"; done
  finish
}

if [ "$(id -u)" != 0 ] || ! ip netns add "$A" 2>/dev/null; then
  skip_two_hosts "creating a network namespace is not permitted here (needs root and ip netns)"
fi
hosts() {
  ip netns add "$B" &&
  ip link add "vA$$" type veth peer name "vB$$" &&
  ip link set "vA$$" netns "$A" && ip link set "vB$$" netns "$B" &&
  ip -n "$A" addr add "$NET.1/24" dev "vA$$" && ip -n "$B" addr add "$NET.2/24" dev "vB$$" &&
  ip -n "$A" link set lo up && ip -n "$B" link set lo up &&
  ip -n "$A" link set "vA$$" up && ip -n "$B" link set "vB$$" up &&
  ip netns exec "$A" unshare --uts true
}
if ! hosts 2>"$T/setup.err"; then
  sed 's/^/#   /' "$T/setup.err"
  skip_two_hosts "this machine lets pipecc make a namespace but not the veth link or UTS namespace the two hosts need"
fi

# The rsh agent: Open MPI calls it as `agent HOST COMMAND...` to start its
# daemon on HOST.  Host B gets its own UTS namespace (host name hostB) and
# an OpenBLAS that would pick other kernels.
cat > "$T/agent.sh" <<EOF
#!/bin/bash
host=\$1; shift
[ "\$host" = "$NET.2" ] || { echo "agent: unknown host \$host" >&2; exit 1; }
exec ip netns exec "$B" unshare --uts /bin/sh -c 'hostname hostB && export OPENBLAS_CORETYPE=Sandybridge && exec /bin/sh -c "\$0"' "\$*"
EOF
chmod +x "$T/agent.sh"
printf '%s slots=2\n%s slots=2\n' "$NET.1" "$NET.2" > "$T/hosts"
on_a() { ip netns exec "$A" unshare --uts /bin/sh -c 'hostname hostA && exec "$@"' sh "$@"; }
MCA=(--mca plm_rsh_agent "$T/agent.sh" --mca btl tcp,self --mca btl_tcp_if_include "$NET.0/24"
     --mca oob_tcp_if_include "$NET.0/24" --hostfile "$T/hosts")

RUNARGS=("${MCA[@]}")
run two on_a
rc2=$?
[ $rc2 = 0 ] && ok "the two-host run trains (stages 0-1 on host A, 2-3 on host B, TCP over the veth link)" ||
  { bad "the two-host run failed (rc $rc2)"; tail -30 "$T/two.out"; }
if [ $rc1 = 0 ] && [ $rc2 = 0 ]; then
  if cmp -s <(cut -d, -f1,2 "$T/one.csv") <(cut -d, -f1,2 "$T/two.csv") && [ "$(wc -l < "$T/one.csv")" = 13 ]; then
    ok "losses are bit-identical on one host and on two ($(tail -1 "$T/one.csv" | cut -d, -f2) at step 12)"
  else
    bad "losses differ between one host and two"; paste -d' ' "$T/one.csv" "$T/two.csv" | head -14
  fi
  if cmp -s "$T/one.onnx" "$T/two.onnx"; then ok "the trained weights (--save) are bit-identical"
  else bad "the trained weights differ between one host and two"; fi
fi

# 2 stages x 2 replicas: world ranks 0-1 (replica 0) on host A, 2-3 (replica 1) on host B (the hostfile's
# slots, in order), so every gradient sum between the replicas crosses the link.
PIPE=rep.pipe run rep-two on_a
rcr2=$?
if [ $rcr1 = 0 ] && [ $rcr2 = 0 ] && cmp -s <(cut -d, -f1,2 "$T/rep-one.csv") <(cut -d, -f1,2 "$T/rep-two.csv") &&
   [ "$(wc -l < "$T/rep-one.csv")" = 13 ] && cmp -s "$T/rep-one.onnx" "$T/rep-two.onnx"; then
  ok "2 stages x 2 replicas on two hosts (a replica on each, the gradient sums over TCP): the same losses and weights as on one"
else
  bad "2 stages x 2 replicas on two hosts differ from one host (rc $rcr1, $rcr2)"; tail -20 "$T/rep-two.out"
fi

# Without run.sh's kernel choice, host B runs other kernels: the stages must
# refuse, naming the host, rather than train to other bits.
(cd "$T/wd" && ip netns exec "$A" unshare --uts /bin/sh -c 'hostname hostA && exec "$@"' sh \
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_CORETYPE=Haswell \
  mpirun --oversubscribe "${MCA[@]}" $(for k in 0 1 2 3; do
    [ $k = 0 ] || printf ': '; printf -- '-n 1 %s --data %s --steps 2 ' "$T/lenet.pipe/stage_$k" "$T/mnist"; done)) \
  >"$T/mixed.out" 2>&1
rc=$?
if [ $rc != 0 ] && grep -q "stage 2 (host hostB) runs OpenBLAS's Sandybridge kernels and stage 0 (host hostA) its Haswell" "$T/mixed.out"; then
  ok "ranks on hosts with other BLAS kernels are refused, naming the stage and host (rc $rc)"
else
  bad "ranks running other BLAS kernels were not refused (rc $rc)"; tail -20 "$T/mixed.out"
fi
finish
