# SPDX-License-Identifier: Apache-2.0
# Install rules, vmsnap.pc and the CMake package: a program built against an installed tree.
vmsnap_sh_test(install tests/integration/install.sh LABELS install TIMEOUT 300)
