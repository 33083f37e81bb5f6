#!/usr/bin/env bash
# up.sh : a real one-node Kubernetes on this machine (root, no systemd, cgroup v1 or v2): containerd (runc,
# cgroupfs), etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy (iptables) and
# CoreDNS. Every address it uses is on the bridge k8sreal0 (10.244.0.1/24, the node's IP) or in the pods'
# network namespaces, or on loopback: the API server listens on the bridge address only, the bridge
# masquerades nothing and CoreDNS forwards nowhere. PIDs go to $W/pids; down.sh undoes all of it.
# Needs: .ci/install-k8s-node.sh once per machine (packages, binaries, base images).
# Env: ASYNCRL_CLUSTER_DIR (run folder, default ~/.cache/asyncrl/cluster/run), ASYNCRL_KUBE_BIN (binaries).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
C="${XDG_CACHE_HOME:-$HOME/.cache}/asyncrl/cluster"
W="${ASYNCRL_CLUSTER_DIR:-$C/run}"; PKI=$W/pki
BIN="${ASYNCRL_KUBE_BIN:?set ASYNCRL_KUBE_BIN to the folder .ci/build-k8s-node.sh prints}"
NODE=asyncrl-node; NODE_IP=10.244.0.1; POD_CIDR=10.244.0.0/24; SVC_CIDR=10.96.0.0/24
SOCK=/run/asyncrl-cluster/containerd/containerd.sock
CTR="ctr --address $SOCK -n k8s.io"
[ -f "$W/pids" ] && { echo "a cluster is already up (or was not torn down): run .ci/cluster/down.sh first" >&2; exit 1; }
rm -rf "$W"; mkdir -p "$W/manifests" "$W/logs"
spawn() { local name=$1; shift; setsid nohup "$@" </dev/null >"$W/logs/$name.log" 2>&1 & echo "$! $name" >> "$W/pids"; }
wait_for() { local what=$1 t=$2; shift 2; local end=$((SECONDS+t)); until "$@" >/dev/null 2>&1; do
  [ $SECONDS -lt $end ] || { echo "timeout waiting for $what (logs: $W/logs)" >&2; return 1; }; sleep 0.5; done
  echo "$what ready after $((SECONDS-START)) s" >&2; }
START=$SECONDS

# 0. the pod bridge carries the node's IP (the CNI bridge plugin reuses it; the API server and kubelet use it)
ip link show k8sreal0 >/dev/null 2>&1 || { ip link add k8sreal0 type bridge; ip addr add $NODE_IP/24 dev k8sreal0; }
ip link set k8sreal0 up
modprobe br_netfilter 2>/dev/null || true
# the host's values, put back by down.sh
sysctl -e net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables 2>/dev/null | sed 's/ //g' > "$W/sysctl.saved"
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
# Pods keep a default route (Ray finds its own address through it) but nothing they send is forwarded off
# the bridge: no masquerade, and this rule drops what would leave through another interface.
iptables -C FORWARD -i k8sreal0 ! -o k8sreal0 -m comment --comment asyncrl-cluster -j DROP 2>/dev/null ||
  iptables -I FORWARD -i k8sreal0 ! -o k8sreal0 -m comment --comment asyncrl-cluster -j DROP

# 1. PKI and kubeconfigs (every client talks to the bridge address)
NODE=$NODE NODE_IP=$NODE_IP bash "$HERE/pki.sh" "$PKI"
kcfg() { # name cert
  cat > "$W/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: asyncrl-test, cluster: {server: "https://$NODE_IP:6443", certificate-authority: "$PKI/ca.crt"}}]
users: [{name: $1, user: {client-certificate: "$PKI/$2.crt", client-key: "$PKI/$2.key"}}]
contexts: [{name: asyncrl-test, context: {cluster: asyncrl-test, user: $1}}]
current-context: asyncrl-test
KC
}
kcfg admin admin; kcfg kubelet kubelet; kcfg controller-manager controller-manager; kcfg scheduler scheduler
kcfg kube-proxy kube-proxy

# 2. containerd (its root under the cache keeps the imported images between runs)
mkdir -p "$C/containerd/root" "$W/cni/net.d" /run/asyncrl-cluster/containerd
sed -e "s#@ROOT@#$C/containerd/root#; s#@CNI@#$W/cni/net.d#" "$HERE/containerd.toml" > "$W/containerd.toml"
cp "$HERE/10-k8sreal.conflist" "$W/cni/net.d/"
if ! ctr --address $SOCK version >/dev/null 2>&1; then
  spawn containerd containerd --config "$W/containerd.toml"
  wait_for containerd 30 ctr --address $SOCK version
fi
# the images built here (bases, and the project's once built): only what containerd does not hold yet
(cd "$HERE/../.." && "${PYTHON:-.venv/bin/python}" -m tests.support.cluster_images import)

# 3. etcd (loopback) and the API server (on the bridge address only)
spawn etcd etcd --name asyncrl-test --data-dir "$W/etcd-data" --logger=zap --log-level=warn \
  --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
  --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster asyncrl-test=http://127.0.0.1:23800 --unsafe-no-fsync --experimental-watch-progress-notify-interval=1s
wait_for etcd 30 curl -sf http://127.0.0.1:23790/health
spawn kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:23790 \
  --bind-address=$NODE_IP --advertise-address=$NODE_IP --secure-port=6443 \
  --tls-cert-file=$PKI/apiserver.crt --tls-private-key-file=$PKI/apiserver.key --client-ca-file=$PKI/ca.crt \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file=$PKI/sa.pub --service-account-signing-key-file=$PKI/sa.key \
  --service-cluster-ip-range=$SVC_CIDR --allow-privileged=true \
  --kubelet-client-certificate=$PKI/apiserver-kubelet-client.crt --kubelet-client-key=$PKI/apiserver-kubelet-client.key \
  --kubelet-preferred-address-types=InternalIP --profiling=false --event-ttl=1h
wait_for kube-apiserver 120 curl -sf --cacert $PKI/ca.crt --cert $PKI/admin.crt --key $PKI/admin.key https://$NODE_IP:6443/readyz

# 4. controller-manager and scheduler (loopback ports)
spawn kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig=$W/controller-manager.kubeconfig \
  --authentication-kubeconfig=$W/controller-manager.kubeconfig --authorization-kubeconfig=$W/controller-manager.kubeconfig \
  --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false --use-service-account-credentials=true \
  --service-account-private-key-file=$PKI/sa.key --root-ca-file=$PKI/ca.crt \
  --cluster-signing-cert-file=$PKI/ca.crt --cluster-signing-key-file=$PKI/ca.key \
  --allocate-node-cidrs=false --service-cluster-ip-range=$SVC_CIDR --profiling=false
sed -e "s#@W@#$W#g" "$HERE/scheduler.yaml" > "$W/scheduler.yaml"
spawn kube-scheduler "$BIN/kube-scheduler" --config=$W/scheduler.yaml --bind-address=127.0.0.1 --secure-port=10259 \
  --authentication-kubeconfig=$W/scheduler.kubeconfig --authorization-kubeconfig=$W/scheduler.kubeconfig

# 5. kubelet (cgroup v1 needs failCgroupV1: false from 1.35 on)
sed -e "s#@W@#$W#g; s#@PKI@#$PKI#g; s#@NODE_IP@#$NODE_IP#g; s#@SOCK@#$SOCK#g" "$HERE/kubelet.yaml" > "$W/kubelet.yaml"
spawn kubelet "$BIN/kubelet" --config=$W/kubelet.yaml --kubeconfig=$W/kubelet.kubeconfig \
  --root-dir=$W/kubelet-root --hostname-override=$NODE --node-ip=$NODE_IP -v=1

# 6. kube-proxy (iptables)
sed -e "s#@W@#$W#g; s#@POD_CIDR@#$POD_CIDR#g; s#@NODE@#$NODE#g" "$HERE/kube-proxy.yaml" > "$W/kube-proxy.yaml"
spawn kube-proxy "$BIN/kube-proxy" --config=$W/kube-proxy.yaml

export KUBECONFIG=$W/admin.kubeconfig
wait_for "node Ready" 180 sh -c "'$BIN/kubectl' get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
# 7. cluster DNS: CoreDNS behind kube-dns 10.96.0.10, without a `forward` (nothing leaves the machine)
"$BIN/kubectl" apply -f "$HERE/coredns.yaml" >/dev/null
"$BIN/kubectl" -n kube-system rollout status deploy/coredns --timeout=120s >/dev/null
echo "CoreDNS ready after $((SECONDS-START)) s" >&2
echo "cluster up in $((SECONDS-START)) s; export KUBECONFIG=$W/admin.kubeconfig" >&2
echo "$W/admin.kubeconfig"
