# SPDX-License-Identifier: Apache-2.0
# vmsnapd, the node daemon (docs/daemon.md): a real daemon on a unix socket in each test.
#   daemon_api       docs/openapi.yaml against the route table and every documented example
#   daemon_security  every refusal of docs/daemon.md's Security section
#   daemon_ops       admission (409, 503 + Retry-After), priorities, cancel, metrics, SIGTERM
#   daemon_budget    the memory budget shared live by the operations in flight
#   daemon_bulk      bulk operations (push, suspend, ...) one worker fewer, at nice +10
#   daemon_vm        a real guest's run, suspend/resume (local store, the RGW), pause, stop, info
#   daemon_sets      push, ls, pull, gc, rm against the RGW, keys only from a node profile
#   daemon_reuse     store connections and credentials kept across operations (RGW, IMDS)
#   daemon_recover   the daemon killed (failpoints) in suspends, resumes, pushes and pulls, then
#                    restarted: its journal's recovery; SIGTERM during a suspend
#   daemon_crash_short  tests/crash/daemon_crash.py, short: kill -9 of the daemon at 3 random
#                    moments of concurrent suspend/resume cycles of 2 VMs, restart, invariants
#   daemon_client    the CLI's client mode (--socket): the same commands direct and through the
#                    daemon, outputs and exit codes compared (sets, and a real guest)
# and the request-handling fuzz target's corpus replayed (fuzz_replay_daemon_request).
if(TARGET vmsnapd)
  foreach(t api security ops budget bulk)
    add_test(NAME daemon_${t} COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/daemon/${t}.py)
    set_tests_properties(daemon_${t} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS daemon
      ENVIRONMENT "VMSNAP_BIN=$<TARGET_FILE:vmsnap_cli>;VMSNAP_SRC=${CMAKE_SOURCE_DIR};VMSNAP_BUILD=${CMAKE_BINARY_DIR};${VMSNAP_TEST_AWS_ENV}")
  endforeach()
  # the VM tests' guest and lock; the RGW of the transfer tests' xfer_rgw fixture
  vmsnap_sh_test(daemon_vm tests/integration/daemon_vm.sh TIMEOUT 600 LABELS "daemon;vm"
                 RESOURCE_LOCK vm)
  set_tests_properties(daemon_vm PROPERTIES FIXTURES_REQUIRED xfer_rgw)
  set_property(TEST daemon_vm APPEND PROPERTY ENVIRONMENT
               "VMSNAP_RGW_STATE=${CMAKE_BINARY_DIR}/rgw-state")
  vmsnap_sh_test(daemon_recover tests/integration/daemon_recover.sh TIMEOUT 600
                 LABELS "daemon;vm" RESOURCE_LOCK vm)
  set_tests_properties(daemon_recover PROPERTIES FIXTURES_REQUIRED vm_golden)
  add_test(NAME daemon_crash_short COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/crash/daemon_crash.py
           --kills 3 --seed 7)
  set_tests_properties(daemon_crash_short PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
    LABELS "daemon;vm;crash" RESOURCE_LOCK vm FIXTURES_REQUIRED vm_golden
    ENVIRONMENT "VMSNAP_BIN=$<TARGET_FILE:vmsnap_cli>;VMSNAPD_BIN=$<TARGET_FILE:vmsnapd>;VMSNAP_GOLDEN=${CMAKE_BINARY_DIR}/vm-golden;VMSNAP_SRC=${CMAKE_SOURCE_DIR}")
  vmsnap_sh_test(daemon_client tests/integration/daemon_client.sh TIMEOUT 600
                 LABELS "daemon;vm" RESOURCE_LOCK vm)
  vmsnap_sh_test(daemon_sets tests/integration/daemon_sets.sh TIMEOUT 300 LABELS daemon
                 RESOURCE_LOCK xfer_rgw_server)
  set_tests_properties(daemon_sets PROPERTIES FIXTURES_REQUIRED xfer_rgw)
  set_property(TEST daemon_sets APPEND PROPERTY ENVIRONMENT
               "VMSNAP_RGW_STATE=${CMAKE_BINARY_DIR}/rgw-state")
  vmsnap_sh_test(daemon_reuse tests/integration/daemon_reuse.sh TIMEOUT 300 LABELS "daemon;store"
                 RESOURCE_LOCK xfer_rgw_server)
  set_tests_properties(daemon_reuse PROPERTIES FIXTURES_REQUIRED xfer_rgw)
  set_property(TEST daemon_reuse APPEND PROPERTY ENVIRONMENT
               "VMSNAP_RGW_STATE=${CMAKE_BINARY_DIR}/rgw-state")
  add_executable(replay_daemon_request ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_daemon_request.c
                                       ${CMAKE_SOURCE_DIR}/tests/fuzz/replay.c)
  target_link_libraries(replay_daemon_request PRIVATE vmsnapd_core)
  add_test(NAME fuzz_replay_daemon_request COMMAND replay_daemon_request
           ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/daemon_request)
  set_tests_properties(fuzz_replay_daemon_request PROPERTIES LABELS "fuzz;daemon" TIMEOUT 300)
  if(VMSNAP_FUZZ AND CMAKE_C_COMPILER_ID STREQUAL "Clang")
    add_executable(fuzz_daemon_request ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_daemon_request.c)
    target_compile_options(fuzz_daemon_request PRIVATE -fsanitize=fuzzer)
    target_link_options(fuzz_daemon_request PRIVATE -fsanitize=fuzzer)
    target_link_libraries(fuzz_daemon_request PRIVATE vmsnapd_core)
  endif()
endif()
