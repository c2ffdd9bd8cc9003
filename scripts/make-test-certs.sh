#!/usr/bin/env bash
# Makes a throwaway CA, a server certificate and a client certificate for trying TLS and
# client certificates on /metrics with examples/web-config.yml, which names these files:
#   scripts/make-test-certs.sh DIR [SERVER_NAME...]
#   cp examples/web-config.yml DIR/ && otel-gpu --web-config-file DIR/web-config.yml
#   curl --cacert DIR/ca.crt --cert DIR/client.crt --key DIR/client.key \
#        -u prometheus:example-only-change-me https://localhost:9400/metrics
# DIR gets ca.crt and ca.key (the CA), server.crt and server.key (for each SERVER_NAME,
# a DNS name or an IP address; default localhost and 127.0.0.1), client.crt and
# client.key (CN prometheus). EC P-256 keys, valid 30 days: for tests, never production.
# Needs openssl (1.1.1 or newer).
set -euo pipefail
if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: scripts/make-test-certs.sh DIR [SERVER_NAME...]" >&2
  exit 2
fi
command -v openssl >/dev/null 2>&1 || { echo "make-test-certs: openssl not found" >&2; exit 1; }
DIR=$1
shift
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(localhost 127.0.0.1)
SAN=""
for name in "${NAMES[@]}"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then
    SAN+="${SAN:+,}IP:$name"
  elif [[ $name =~ ^[A-Za-z0-9*]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$ ]]; then
    SAN+="${SAN:+,}DNS:$name"
  else
    echo "make-test-certs: $name is neither a DNS name nor an IP address" >&2
    exit 2
  fi
done
mkdir -p "$DIR"
cd "$DIR"
umask 077  # the keys are readable by their owner only
DAYS=30

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# leaf NAME CN USAGE [SAN]: a key and a certificate signed by the CA
leaf() {
  local ext="$1.ext"
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/O=otel-gpu test/CN=$2" -out "$1.csr"
  {
    echo "basicConstraints = critical, CA:FALSE"
    echo "keyUsage = critical, digitalSignature"
    echo "extendedKeyUsage = $3"
    echo "subjectKeyIdentifier = hash"
    echo "authorityKeyIdentifier = keyid"
    [ -z "${4:-}" ] || echo "subjectAltName = $4"
  } > "$ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$DAYS" \
    -sha256 -extfile "$ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$ext"
}

key ca.key
openssl req -x509 -new -key ca.key -subj "/O=otel-gpu test/CN=otel-gpu test CA" -days "$DAYS" \
  -sha256 -addext "basicConstraints = critical, CA:TRUE" \
  -addext "keyUsage = critical, keyCertSign, cRLSign" \
  -addext "subjectKeyIdentifier = hash" -out ca.crt
leaf server "${NAMES[0]}" serverAuth "$SAN"
leaf client prometheus clientAuth
rm -f ca.srl
chmod 0644 ca.crt server.crt client.crt
echo "$DIR: ca.crt ca.key server.crt server.key client.crt client.key (server: ${SAN})" >&2
