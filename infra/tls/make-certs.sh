#!/usr/bin/env bash
# A private CA and a collector certificate signed by it, with openssl, for
# `hoptrace collect --tls-cert/--tls-key` and the probes' `--collector-ca`.
#
#   infra/tls/make-certs.sh DIR NAME...   # NAME: the collector's IP addresses or DNS names
#
# Writes DIR/ca.pem (give it to the probes), DIR/ca-key.pem (keep it), DIR/collector.pem
# and DIR/collector-key.pem (give them to the collector). Certificates last 30 days.
set -euo pipefail

if (($# < 2)); then
    echo "usage: $0 DIR NAME... (the collector's IP addresses or DNS names)" >&2
    exit 2
fi
dir=$1
shift
mkdir -p "$dir"
san=""
for name in "$@"; do
    if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then
        san+="${san:+,}IP:$name"
    else
        san+="${san:+,}DNS:$name"
    fi
done

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=hoptrace collector CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
    -keyout "$dir/collector-key.pem" -out "$dir/collector.csr" 2>/dev/null
openssl x509 -req -in "$dir/collector.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
    -CAcreateserial -days 30 -out "$dir/collector.pem" \
    -extfile <(printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$san") 2>/dev/null
rm -f "$dir/collector.csr" "$dir/ca.srl"
chmod 600 "$dir/ca-key.pem" "$dir/collector-key.pem"
echo "tls: $dir/ca.pem (for --collector-ca), $dir/collector.pem and $dir/collector-key.pem (for --tls-cert/--tls-key), names: $san"
