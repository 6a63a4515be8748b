# SPDX-License-Identifier: Apache-2.0
# The library's sources, one block per module folder, in dependency order (docs/ARCHITECTURE.md):
# util <- sys <- {image, store, pcache, objcache, disk, vmm} <- xfer <- vm. A new file is added here.

set(VMSNAP_UTIL_SOURCES
    lib/util/cancel.c
    lib/util/err.c
    lib/util/misc.c)

set(VMSNAP_SYS_SOURCES
    lib/sys/crypto_dl.c
    lib/sys/dirswap.c
    lib/sys/fileio.c)

set(VMSNAP_IMAGE_SOURCES
    lib/image/image_dec.c
    lib/image/image_enc.c
    lib/image/image_enc_buf.c
    lib/image/image_enc_delta.c
    lib/image/image_enc_range.c
    lib/image/image_enc_scan.c
    lib/image/image_enc_write.c
    lib/image/image_enc_zstd.c
    lib/image/image_io.c
    lib/image/image_pages.c
    lib/image/image_rec.c
    lib/image/image_seq.c)

set(VMSNAP_STORE_SOURCES
    lib/store/store.c
    lib/store/store_local.c
    lib/store/s3/s3.c
    lib/store/s3/s3_config.c
    lib/store/s3/s3_creds.c
    lib/store/s3/s3_curl.c
    lib/store/s3/s3_fetch.c
    lib/store/s3/s3_gcs_jwt.c
    lib/store/s3/s3_gcs_token.c
    lib/store/s3/s3_list.c
    lib/store/s3/s3_pool.c
    lib/store/s3/s3_profile.c
    lib/store/s3/s3_providers.c
    lib/store/s3/s3_request.c
    lib/store/s3/s3_xml.c
    lib/store/s3/sigv4.c)

set(VMSNAP_PCACHE_SOURCES
    lib/pcache/pcache_evict.c
    lib/pcache/pcache_retry.c
    lib/pcache/pcache_stat.c
    lib/pcache/pcache_walk.c)

set(VMSNAP_OBJCACHE_SOURCES
    lib/objcache/objcache.c
    lib/objcache/objcache_evict.c
    lib/objcache/objcache_fill.c)

set(VMSNAP_DISK_SOURCES
    lib/disk/disk.c
    lib/disk/disk_clone.c
    lib/disk/disk_ext2.c
    lib/disk/disk_io.c
    lib/disk/disk_tree.c
    lib/disk/disk_tree_write.c)

set(VMSNAP_VMM_SOURCES
    lib/vmm/vmm.c
    lib/vmm/vmm_qemu.c
    lib/vmm/vmm_qmp.c)

set(VMSNAP_XFER_SOURCES
    lib/xfer/manifest.c
    lib/xfer/manifest_layers.c
    lib/xfer/xfer_ctx.c
    lib/xfer/xfer_download.c
    lib/xfer/xfer_export.c
    lib/xfer/xfer_gc.c
    lib/xfer/xfer_gc_reach.c
    lib/xfer/xfer_layers_need.c
    lib/xfer/xfer_layers_pull.c
    lib/xfer/xfer_layers_push.c
    lib/xfer/xfer_leftover.c
    lib/xfer/xfer_ls.c
    lib/xfer/xfer_marks.c
    lib/xfer/xfer_pool.c
    lib/xfer/xfer_pull.c
    lib/xfer/xfer_push.c
    lib/xfer/xfer_rm.c
    lib/xfer/xfer_set_push.c
    lib/xfer/xfer_set_undo.c
    lib/xfer/xfer_upload.c
    lib/xfer/xfer_verify.c)

set(VMSNAP_VM_SOURCES
    lib/vm/vm_checkpoint.c
    lib/vm/vm_console.c
    lib/vm/vm_ctx.c
    lib/vm/vm_ls.c
    lib/vm/vm_record.c
    lib/vm/vm_recover.c
    lib/vm/vm_resume.c
    lib/vm/vm_run.c
    lib/vm/vm_stop.c
    lib/vm/vm_suspend.c)

set(VMSNAP_LIB_SOURCES "")
foreach(mod UTIL SYS IMAGE STORE PCACHE OBJCACHE DISK VMM XFER VM)
  foreach(src IN LISTS VMSNAP_${mod}_SOURCES)
    list(APPEND VMSNAP_LIB_SOURCES ${CMAKE_SOURCE_DIR}/${src})
  endforeach()
endforeach()
