#!/usr/bin/env bash
# Builds the agent's OCI image with podman from the static musl release
# build: deploy/kubernetes/build-image.sh [IMAGE]
# (default localhost/gitlab-haproxy-agent:<version>). Prints the image name
# and its size; fails if the image is 15 MB or more.
set -euo pipefail
cd "$(dirname "$0")/../.."

target=x86_64-unknown-linux-musl
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
image=${1:-localhost/gitlab-haproxy-agent:$version}
max_bytes=$((15 * 1000 * 1000))

rustup target list --installed 2>/dev/null | grep -qx "$target" || rustup target add "$target"
# Frame pointers: /debug/pprof/ unwinds samples by them. libunwind cannot
# step through musl's signal trampoline (it has no unwind info), so without
# them every sample of a static build is empty.
RUSTFLAGS="-C force-frame-pointers=yes" \
  cargo build --release --locked --target "$target" --features frame-pointer --bin gitlab-haproxy-agent

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
# Symbols stay in the binary: /debug/pprof/ names functions with them.
cp "target/$target/release/gitlab-haproxy-agent" deploy/kubernetes/Containerfile "$context/"
podman build --quiet --tag "$image" --file "$context/Containerfile" "$context" >/dev/null

size=$(podman image inspect --format '{{.Size}}' "$image")
echo "$image $size bytes"
if [ "$size" -ge "$max_bytes" ]; then
  echo "build-image: $image is $size bytes, over the $max_bytes limit" >&2
  exit 1
fi
