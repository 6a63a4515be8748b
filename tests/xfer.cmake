# SPDX-License-Identifier: Apache-2.0
# Transfer tests: unit tests of the signer/XML/URL/manifest code, the local store end to end, and
# the S3 backend against a real Ceph RGW that the xfer_rgw fixture starts once per ctest run
# (state and free ports under this build directory, so the normal and ASan builds each start
# their own) and stops by pid file.
vmsnap_c_test(s3_unit SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_sigv4.c TIMEOUT 60 LABELS store)
vmsnap_c_test(store_url SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_store_url.c TIMEOUT 60 LABELS store)
vmsnap_sh_test(xfer_local tests/integration/xfer_local.sh TIMEOUT 300)
# layered sets (tests/integration/xfer_layers.sh) on the local store; the S3 run is below
vmsnap_sh_test(xfer_layers_local tests/integration/xfer_layers.sh TIMEOUT 300)
set_property(TEST xfer_layers_local APPEND PROPERTY ENVIRONMENT "LAYERS_STORE=local")

set(VMSNAP_RGW_STATE ${CMAKE_BINARY_DIR}/rgw-state)
add_test(NAME xfer_rgw_up COMMAND bash ${CMAKE_SOURCE_DIR}/tests/rgw-up.sh ${VMSNAP_RGW_STATE})
set_tests_properties(xfer_rgw_up PROPERTIES FIXTURES_SETUP xfer_rgw TIMEOUT 180
                     SKIP_RETURN_CODE 77)
add_test(NAME xfer_rgw_down COMMAND bash ${CMAKE_SOURCE_DIR}/tests/rgw-down.sh ${VMSNAP_RGW_STATE})
set_tests_properties(xfer_rgw_down PROPERTIES FIXTURES_CLEANUP xfer_rgw TIMEOUT 60)

add_executable(vmsnap_faultproxy ${CMAKE_SOURCE_DIR}/tests/faultproxy.c)

# crash_short: the crash matrix's short fixed-seed run (tests/crash/crash.py)
foreach(t IN ITEMS xfer_s3 xfer_s3_faults crash_short xfer_layers_s3)
  if(t STREQUAL crash_short)
    vmsnap_sh_test(${t} tests/crash/crash_short.sh TIMEOUT 600 LABELS crash)
  elseif(t STREQUAL xfer_layers_s3)
    vmsnap_sh_test(${t} tests/integration/xfer_layers.sh TIMEOUT 600)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "LAYERS_STORE=s3")
  else()
    vmsnap_sh_test(${t} tests/integration/${t}.sh TIMEOUT 600)
  endif()
  set_tests_properties(${t} PROPERTIES FIXTURES_REQUIRED xfer_rgw RESOURCE_LOCK xfer_rgw_server)
  set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT
               "VMSNAP_RGW_STATE=${VMSNAP_RGW_STATE};VMSNAP_FAULTPROXY=$<TARGET_FILE:vmsnap_faultproxy>")
endforeach()

# Every advising message of the CLI, the stores and the transfer: provoked, and the command it
# advises run (tests/integration/advice.sh); local store first, then the same RGW.
vmsnap_sh_test(advice tests/integration/advice.sh TIMEOUT 600 LABELS xfer)
set_tests_properties(advice PROPERTIES FIXTURES_REQUIRED xfer_rgw RESOURCE_LOCK xfer_rgw_server)
set_property(TEST advice APPEND PROPERTY ENVIRONMENT
             "VMSNAP_RGW_STATE=${VMSNAP_RGW_STATE};VMSNAP_FAULTPROXY=$<TARGET_FILE:vmsnap_faultproxy>")

# The S3 credential chain and TLS against the same RGW, with the credential endpoints (IMDSv2,
# container, STS) and a TLS terminator played by python3 servers on loopback (tests/servers/);
# s3_creds_gcs: gs:// with Google OAuth tokens (a token endpoint, the GCE metadata server, and
# Cloud Storage's front door in front of RGW).
foreach(t IN ITEMS s3_creds_profile s3_creds_providers s3_creds_refresh s3_creds_tls s3_creds_gcs)
  vmsnap_sh_test(${t} tests/integration/${t}.sh TIMEOUT 600 LABELS store)
  set_tests_properties(${t} PROPERTIES FIXTURES_REQUIRED xfer_rgw RESOURCE_LOCK xfer_rgw_server)
  set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT
               "VMSNAP_RGW_STATE=${VMSNAP_RGW_STATE};VMSNAP_FAULTPROXY=$<TARGET_FILE:vmsnap_faultproxy>")
endforeach()

# Unit tests of the transfer's parts on their own, each one C program: the manifest and push
# mark (parse/build round trips, hostile bytes), the local store backend through the store API,
# and the worker pool's byte budget.
vmsnap_c_test(xfer_manifest SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_manifest.c TIMEOUT 60
              LABELS xfer)
vmsnap_c_test(store_local SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_store_local.c TIMEOUT 60
              LABELS xfer)
vmsnap_c_test(xfer_pool SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_xfer_pool.c TIMEOUT 120
              LABELS xfer)
