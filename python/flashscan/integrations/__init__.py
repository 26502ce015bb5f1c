"""flashscan.integrations: adapters that put flashscan's kernels under other libraries' models.

    from flashscan.integrations.transformers import ATTN_IMPLEMENTATION, use_flashscan_kernels

Each integration imports its library only when its module is imported: `import flashscan`
never imports transformers. They sit above the core API and call only its public functions
(`flashscan.flash_attn_func`, `selective_scan_fn`, ...), so the checks and errors of the core
API are the ones users see.
"""
