# SPDX-License-Identifier: Apache-2.0
# VM tests (lib/vmm/, lib/vm/, cli/cmd_vm.c): a unit test of the QMP/config helpers, and real
# QEMU + the real counter guest (guest/build.sh; TCG here). vm_golden boots the guest once per
# ctest run and pauses it to a golden checkpoint in the build directory; the other cases resume
# copies of it. All hold the "vm" lock: one guest at a time, memory capped by VM_MEM (256M).
vmsnap_c_test(vm_unit SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_vmm.c TIMEOUT 60 LABELS vm)

vmsnap_sh_test(vm_golden tests/integration/vm_golden.sh TIMEOUT 300 LABELS vm RESOURCE_LOCK vm)
set_tests_properties(vm_golden PROPERTIES FIXTURES_SETUP vm_golden)
foreach(t IN ITEMS vm_local vm_store vm_faults vm_crash vm_full vm_ready vm_shutdown)
  vmsnap_sh_test(${t} tests/integration/${t}.sh TIMEOUT 400 LABELS vm RESOURCE_LOCK vm)
  set_tests_properties(${t} PROPERTIES FIXTURES_REQUIRED vm_golden)
endforeach()

# Suspend to a real RGW and S3 down during suspend, against the RGW of the transfer tests'
# xfer_rgw fixture (tests/xfer.cmake, included after this file: same state path).
vmsnap_sh_test(vm_s3 tests/integration/vm_s3.sh TIMEOUT 400 LABELS vm RESOURCE_LOCK vm)
set_tests_properties(vm_s3 PROPERTIES FIXTURES_REQUIRED "vm_golden;xfer_rgw")
set_property(TEST vm_s3 APPEND PROPERTY ENVIRONMENT "VMSNAP_RGW_STATE=${CMAKE_BINARY_DIR}/rgw-state"
             "VMSNAP_FAULTPROXY=$<TARGET_FILE:vmsnap_faultproxy>")
# Every advising VM message provoked, and the command it advises run (tests/integration/vm_advice.sh;
# S3 down and up against the same RGW, a fault proxy in front of it)
vmsnap_sh_test(vm_advice tests/integration/vm_advice.sh TIMEOUT 600 LABELS vm RESOURCE_LOCK vm)
set_tests_properties(vm_advice PROPERTIES FIXTURES_REQUIRED "vm_golden;xfer_rgw")
set_property(TEST vm_advice APPEND PROPERTY ENVIRONMENT
             "VMSNAP_RGW_STATE=${CMAKE_BINARY_DIR}/rgw-state"
             "VMSNAP_FAULTPROXY=$<TARGET_FILE:vmsnap_faultproxy>")
# The crash matrix's VM operations, short (tests/crash/crash.py)
vmsnap_sh_test(crash_vm_short tests/crash/crash_vm_short.sh TIMEOUT 600 LABELS vm crash
               RESOURCE_LOCK vm)
set_tests_properties(crash_vm_short PROPERTIES FIXTURES_REQUIRED "vm_golden;xfer_rgw")
set_property(TEST crash_vm_short APPEND PROPERTY ENVIRONMENT
             "VMSNAP_RGW_STATE=${CMAKE_BINARY_DIR}/rgw-state")
# Layered suspends and resumes (deltas, chains, the node cache), against the same RGW
vmsnap_sh_test(vm_layers tests/integration/vm_layers.sh TIMEOUT 600 LABELS vm RESOURCE_LOCK vm)
set_tests_properties(vm_layers PROPERTIES FIXTURES_REQUIRED "vm_golden;xfer_rgw")
set_property(TEST vm_layers APPEND PROPERTY ENVIRONMENT
             "VMSNAP_RGW_STATE=${CMAKE_BINARY_DIR}/rgw-state")

# The QMP reply parser on untrusted bytes (vmsnap_fuzz comes from tests/fuzz.cmake, included
# before this file).
if(COMMAND vmsnap_fuzz)
  vmsnap_fuzz(qmp fuzz_qmp.c)
endif()
