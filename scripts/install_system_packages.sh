#!/usr/bin/env bash
# Debian packages the test suite needs beyond Python: Chromium (the offline HTML report
# is rendered in a real browser) and SLURM (slurmctld, slurmd, munge: the cluster tests
# submit real jobs; iproute2 and util-linux's nsenter put the two-node cluster's nodes in
# their own network namespaces). Installs only what is missing; needs root and apt-get.
# Called by `make test`; prints nothing when everything is there.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
for tool in sbatch slurmctld slurmd munged; do
  command -v "$tool" >/dev/null 2>&1 || { need+=(slurmctld slurmd slurm-client munge); break; }
done
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing system packages (${need[*]}): install them as root with apt-get; the tests that need them fail in CI" >&2
  exit 0
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}
