"""Kernel sites the bytes alone do not reveal, and what they do to a verdict.

    sites          the kernel's own tables and text ranges -> SiteIndex
    variants       every byte string that can run at a boot-patched site
    site_verdicts  an instruction's finding in the light of its sites
"""
