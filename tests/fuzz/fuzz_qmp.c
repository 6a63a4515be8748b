/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the QMP reply classifier on untrusted bytes (what a hostile or broken QEMU could
 * send on its socket). A reply is an event/greeting (0), a return (1, with a value), or an error
 * (negative, with a message that names the command); a status string maps to a state of a live
 * process (running through io-error: a process that answers is not dead), one with a name of its
 * own unless it is "other" (a state added to the enum without a name would read as "other"). */
#include "vmm/vmm_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20))
        return 0;
    char *line = malloc(size + 1);
    if (!line)
        return 0;
    memcpy(line, data, size);
    line[size] = 0;
    struct vmsnap_err err = {0};
    json_object *ret = NULL;
    int rc = qmp_parse_reply(line, "fuzz-cmd", &ret, &err);
    if (rc < 0 && (err.code != -rc || !strstr(err.msg, "fuzz-cmd")))
        abort();
    if (rc != 1 && ret)
        abort();
    json_object *st = NULL;
    if (ret && json_object_is_type(ret, json_type_object) &&
        json_object_object_get_ex(ret, "status", &st)) {
        enum vmsnap_vmm_state s = qmp_status_state(json_object_get_string(st));
        if (s < VMSNAP_VMM_RUNNING || s > VMSNAP_VMM_IO_ERROR ||
            (s != VMSNAP_VMM_OTHER) != (strcmp(vmsnap_vmm_state_name(s), "other") != 0))
            abort();
    }
    json_object_put(ret);
    free(line);
    return 0;
}
