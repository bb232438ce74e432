"""The probe runtime: a real kernel image in unicorn, boot-patched, with probes
placed only where the relocation of the live instruction is proved.

* ``kernel``: the machine (image mapped at its link-time addresses, per-cpu
  data at a gs base, a stack and a trampoline per execution context) and the
  boot patches for a named CPU feature set;
* ``verdicts``: the verdict of the live variant at an address, for one
  trampoline, from the checker or from a store;
* ``probes``: ``enable``/``disable`` and the trap handler (callbacks, then
  the plan: the context's trampoline or the emulation's effects);
* ``args`` and ``differential``: real kernel functions run from random
  inputs unprobed and with every instruction probed, and compared;
* ``run``: one such run as ``relocverify run`` asks for it (``FunctionRun``).
"""
