# SPDX-License-Identifier: Apache-2.0
# Page-cache hygiene tests (lib/pcache*.c, cli/cmd_cache.c).
vmsnap_c_test(pcache_unit SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_pcache.c TIMEOUT 120
              LABELS pcache)
if(DEP_libseccomp_FOUND)
  vmsnap_c_test(pcache_seccomp SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_pcache_seccomp.c
                TIMEOUT 120 LABELS pcache)
else()
  add_test(NAME pcache_seccomp COMMAND sh -c
           "echo 'SKIP: libseccomp-dev not installed (scripts/deps.sh)'; [ \"$VMSNAP_REQUIRE_ALL\" = 1 ] && exit 1; exit 77")
  set_tests_properties(pcache_seccomp PROPERTIES SKIP_RETURN_CODE 77)
endif()
vmsnap_sh_test(pcache_cli tests/integration/pcache_cli.sh TIMEOUT 120 LABELS pcache)
