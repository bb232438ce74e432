"""The soundness selftest: the trust base checked against this machine's CPU.

``form_validation`` validates instruction forms (the table ``proof.form_table`` reads);
``operators`` makes candidate false proofs by mutating real relocations; ``judgement`` runs
both sides of each on the CPU; ``run`` ties them into ``relocverify selftest``.
"""
