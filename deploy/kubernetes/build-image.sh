#!/usr/bin/env bash
# Builds the agent's OCI image with podman from the glibc release binary and
# the shared libraries it links: deploy/kubernetes/build-image.sh [IMAGE]
# (default localhost/gitlab-haproxy-agent:<version>). Prints the image name
# and its size; fails if the image is 20 MB or more. The Containerfile's
# header says why glibc and not musl.
set -euo pipefail
cd "$(dirname "$0")/../.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
image=${1:-localhost/gitlab-haproxy-agent:$version}
max_bytes=$((20 * 1000 * 1000))
bin=target/release/gitlab-haproxy-agent

# The command `cargo deb` runs, with no extra flags or features: after a
# package build this finds target/release fresh and compiles nothing.
cargo build --release --locked --bin gitlab-haproxy-agent

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
# Symbols stay in the binary: /debug/pprof/ names functions with them
# (`cargo deb` strips only the copy it packages).
install -D -m 755 "$bin" "$context/root/usr/local/bin/gitlab-haproxy-agent"
# The libraries at the paths the binary asks for (the loader's path is in
# its ELF header, the others are found in the loader's default directories).
libs=$(ldd "$bin" | grep -o '/[^ ]*') || true
[ -n "$libs" ] || { echo "build-image: ldd found no libraries for $bin" >&2; exit 1; }
for lib in $libs; do
  install -D -m 755 "$(readlink -f "$lib")" "$context/root$lib"
done
cp deploy/kubernetes/Containerfile "$context/"
podman build --quiet --tag "$image" --file "$context/Containerfile" "$context" >/dev/null

size=$(podman image inspect --format '{{.Size}}' "$image")
echo "$image $size bytes"
if [ "$size" -ge "$max_bytes" ]; then
  echo "build-image: $image is $size bytes, over the $max_bytes limit" >&2
  exit 1
fi
