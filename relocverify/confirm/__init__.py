"""``relocverify confirm``: the audit's findings tried on the running kernel.

The package's kernel boots under QEMU with a busybox initramfs (``guest``, ``qemu``), once without
a probe and once with the real tracer's probe at a site (``probe``, ``script``), a trigger makes
it run (``triggers``), and the two consoles (``console``) decide the outcome (``outcome``);
``confirmation`` runs that per site and ``sites`` resolves them.  The guest's own helpers and
triggers are C programs in ``programs/``.
"""
