# SPDX-License-Identifier: Apache-2.0
# Image codec tests (issue: codec). Helpers are in tests/CMakeLists.txt.
set(IMG_UTIL ${CMAKE_SOURCE_DIR}/tests/unit/img_util.c)
vmsnap_c_test(image_roundtrip SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_image_roundtrip.c ${IMG_UTIL} LABELS image)
vmsnap_c_test(image_interop SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_image_interop.c ${IMG_UTIL} LABELS image)
vmsnap_c_test(image_corrupt SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_image_corrupt.c ${IMG_UTIL} LABELS image)
vmsnap_c_test(image_base SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_image_base.c ${IMG_UTIL} LABELS image)
vmsnap_sh_test(image_cli tests/integration/image_cli.sh LABELS image)
vmsnap_c_test(image_delta SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_image_delta.c ${IMG_UTIL} LABELS image)
