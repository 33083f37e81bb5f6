#!/usr/bin/env bash
# pki.sh DIR : CA, apiserver serving cert, client certs for admin/kubelet/controller-manager/scheduler/kube-proxy, SA keys
set -euo pipefail
D="$1"; NODE="${NODE:-asyncrl-node}"; NODE_IP="${NODE_IP:-10.244.0.1}"
mkdir -p "$D"; cd "$D"
[ -f ca.crt ] && exit 0
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj /CN=asyncrl-test-cluster-ca 2>/dev/null
printf 'subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.96.0.1,IP:%s\nextendedKeyUsage=serverAuth\n' "$NODE_IP" > server.ext
printf 'subjectAltName=DNS:%s,IP:%s,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' "$NODE" "$NODE_IP" > kubelet-server.ext
echo 'extendedKeyUsage=clientAuth' > client.ext
cert() { # name subj ext
  openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 30 -extfile "$3" 2>/dev/null
}
cert apiserver /CN=kube-apiserver server.ext
cert kubelet-server "/CN=$NODE" kubelet-server.ext
cert admin /O=system:masters/CN=admin client.ext
cert kubelet "/O=system:nodes/CN=system:node:$NODE" client.ext
cert controller-manager /CN=system:kube-controller-manager client.ext
cert scheduler /CN=system:kube-scheduler client.ext
cert kube-proxy /CN=system:kube-proxy client.ext
cert apiserver-kubelet-client /O=system:masters/CN=kube-apiserver-kubelet-client client.ext
openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
