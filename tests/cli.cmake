# SPDX-License-Identifier: Apache-2.0
# The CLI as a whole: what it prints of hostile names (every printing path, text and JSON).
vmsnap_sh_test(cli_names tests/integration/cli_names.sh LABELS cli)
