# SPDX-License-Identifier: Apache-2.0
# The node-local object cache (lib/objcache/, cli/cmd_cache.c's objects and trim).
vmsnap_c_test(objcache_unit SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_objcache.c TIMEOUT 300
              LABELS objcache)
vmsnap_sh_test(objcache_cli tests/integration/objcache_cli.sh TIMEOUT 120 LABELS objcache)
