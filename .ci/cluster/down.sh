#!/usr/bin/env bash
# down.sh : stop the cluster up.sh started and leave nothing behind: no container, shim, mount, network
# namespace, bridge or iptables chain. Safe to run twice, or after a failed up.sh.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
C="${XDG_CACHE_HOME:-$HOME/.cache}/asyncrl/cluster"
W="${ASYNCRL_CLUSTER_DIR:-$C/run}"
BIN="${ASYNCRL_KUBE_BIN:-}"
SOCK=/run/asyncrl-cluster/containerd/containerd.sock
CTR="ctr --address $SOCK -n k8s.io"
export KUBECONFIG=$W/admin.kubeconfig
# 1. let the kubelet stop every pod (CNI DEL, unmounts) while it still runs
if [ -n "$BIN" ] && [ -f "$KUBECONFIG" ] && "$BIN/kubectl" get --raw /readyz >/dev/null 2>&1; then
  "$BIN/kubectl" delete deploy,ds,rs,sts,job --all -A --wait=false >/dev/null 2>&1
  "$BIN/kubectl" delete pods --all -A --grace-period=1 --wait=false >/dev/null 2>&1
  for _ in $(seq 1 60); do [ -z "$($CTR tasks ls -q 2>/dev/null)" ] && break; sleep 0.5; done
fi
# 2. stop the processes up.sh started, newest first (by PID, never by name)
if [ -f "$W/pids" ]; then
  tac "$W/pids" | while read -r pid name; do kill "$pid" 2>/dev/null && echo "stopped $name ($pid)" >&2; done
  for _ in $(seq 1 20); do
    alive=0; while read -r pid name; do kill -0 "$pid" 2>/dev/null && alive=1; done < "$W/pids"
    [ $alive = 0 ] && break; sleep 0.5
  done
  tac "$W/pids" | while read -r pid name; do kill -0 "$pid" 2>/dev/null && kill -9 "$pid" && echo "killed $name ($pid)" >&2; done
fi
# 3. what the kubelet did not clean up: tasks (their shims exit with them), containers, then containerd
if ctr --address $SOCK version >/dev/null 2>&1; then
  for t in $($CTR tasks ls -q 2>/dev/null); do $CTR tasks kill -s SIGKILL "$t" 2>/dev/null; done; sleep 1
  for t in $($CTR tasks ls -q 2>/dev/null); do $CTR tasks rm -f "$t" 2>/dev/null; done
  for c in $($CTR containers ls -q 2>/dev/null); do $CTR containers rm "$c" 2>/dev/null; done
fi
# shims whose containerd is gone: the ones serving our socket's namespace (matched by our state folder)
for pid in $(pgrep -f 'containerd-shim-runc-v2 .*-address /run/asyncrl-cluster/' 2>/dev/null); do
  kill -9 "$pid" 2>/dev/null && echo "killed shim $pid" >&2
done
[ -n "$BIN" ] && "$BIN/kube-proxy" --cleanup >/dev/null 2>&1
# the kubelet's and kube-proxy's chains (KUBE-*), in the nft and legacy tables, and up.sh's FORWARD rule
for ipt in iptables ip6tables iptables-legacy ip6tables-legacy; do
  command -v $ipt >/dev/null || continue
  for t in filter nat mangle; do
    $ipt -t $t -S 2>/dev/null | grep -E '^-A [A-Z]+ .*(-j KUBE-|asyncrl-cluster)' | sed 's/^-A/-D/' |
      while read -r rule; do eval "$ipt -t $t $rule" 2>/dev/null; done
    for c in $($ipt -t $t -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do $ipt -t $t -F "$c" 2>/dev/null; done
    for c in $($ipt -t $t -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do $ipt -t $t -X "$c" 2>/dev/null; done
  done
done
for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns del "$ns"; done
ip link del k8sreal0 2>/dev/null
rm -rf /var/lib/cni/networks/k8sreal /var/lib/cni/results/k8sreal-*
grep -E " ($W|/run/asyncrl-cluster|$C/containerd)/" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l
if [ -f "$W/sysctl.saved" ]; then   # the host's forwarding settings as they were before up.sh
  while read -r kv; do sysctl -qw "$kv" 2>/dev/null; done < "$W/sysctl.saved"
  rm -f "$W/sysctl.saved"
fi
rm -f "$W/pids"
echo "cluster down" >&2
