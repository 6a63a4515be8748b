# SPDX-License-Identifier: Apache-2.0
# The CLI as a whole: what it prints of hostile names (every printing path, text and JSON).
vmsnap_sh_test(cli_names tests/integration/cli_names.sh LABELS cli)
# The contract for scripts (docs/cli.md): exit classes, --json of every verb, -f, -T, -q/-v,
# did-you-mean, the progress line. Its S3 part (access denied, unreachable) runs against the
# xfer_rgw fixture's RGW.
vmsnap_sh_test(cli_contract tests/integration/cli_contract.sh TIMEOUT 300 LABELS cli)
set_tests_properties(cli_contract PROPERTIES FIXTURES_REQUIRED xfer_rgw RESOURCE_LOCK xfer_rgw_server)
set_property(TEST cli_contract APPEND PROPERTY ENVIRONMENT
             "VMSNAP_RGW_STATE=${CMAKE_BINARY_DIR}/rgw-state;VMSNAP_FAULTPROXY=$<TARGET_FILE:vmsnap_faultproxy>")
# The man pages and the bash and zsh completions as cmake --install puts them in a prefix: man and
# groff render them without a warning, the bash completion completes (compgen), zsh parses and
# registers _vmsnap, and each of them, vmsnap help VERB and the parser itself agree option for
# option (the tables of cli.h).
vmsnap_sh_test(cli_docs tests/integration/cli_docs.sh LABELS "cli;install" TIMEOUT 600)
