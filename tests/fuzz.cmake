# SPDX-License-Identifier: Apache-2.0
# Fuzz targets for every parser of untrusted bytes. Each has a replay driver run by ctest over
# its corpus (tests/fuzz/corpus/<name>) in every build; with -DVMSNAP_FUZZ=ON and clang, the
# libFuzzer binary fuzz_<name> is built too (run it by hand: ./fuzz_image -max_total_time=60 DIR).
function(vmsnap_fuzz name source)
  add_executable(replay_${name} ${CMAKE_SOURCE_DIR}/tests/fuzz/${source} ${CMAKE_SOURCE_DIR}/tests/fuzz/replay.c)
  target_include_directories(replay_${name} PRIVATE ${CMAKE_SOURCE_DIR}/lib)
  target_link_libraries(replay_${name} PRIVATE vmsnap_static)
  add_test(NAME fuzz_replay_${name} COMMAND replay_${name} ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${name})
  set_tests_properties(fuzz_replay_${name} PROPERTIES LABELS fuzz TIMEOUT 300)
  if(VMSNAP_FUZZ AND CMAKE_C_COMPILER_ID STREQUAL "Clang")
    add_executable(fuzz_${name} ${CMAKE_SOURCE_DIR}/tests/fuzz/${source})
    target_include_directories(fuzz_${name} PRIVATE ${CMAKE_SOURCE_DIR}/lib)
    target_compile_options(fuzz_${name} PRIVATE -fsanitize=fuzzer)
    target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer)
    target_link_libraries(fuzz_${name} PRIVATE vmsnap_static)
  endif()
endfunction()

vmsnap_fuzz(image fuzz_image_decode.c)
vmsnap_fuzz(seek_table fuzz_seek_table.c)
vmsnap_fuzz(s3_xml fuzz_s3_xml.c)
vmsnap_fuzz(manifest fuzz_manifest.c)
vmsnap_fuzz(aws_profile fuzz_aws_profile.c)
vmsnap_fuzz(cred_json fuzz_cred_json.c)
vmsnap_fuzz(sts_xml fuzz_sts_xml.c)
vmsnap_fuzz(gcs_json fuzz_gcs_json.c)
