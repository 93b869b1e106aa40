# Sourced by .ci/run (set -euo pipefail, as root, fresh Debian 12): Debian's Chromium for the
# dashboard's browser test. Playwright drives it through executable_path; `playwright install`
# is never run (it downloads its own browser, which the closed network refuses).
if ! command -v chromium >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q chromium
fi
GEMMTUNE_CHROMIUM="$(command -v chromium)"
export GEMMTUNE_CHROMIUM
