"""torchras's app layer: what ties ``rasd`` and ``inprocess`` together for a user (``rasd launch``).

docs/architecture.md section 1, "The direction of imports": the app layer may import both packages, and neither
imports it. The ``rasd`` console script enters here (``torchras.cli``), so ``rasd launch`` lives above both while
``rasd.cli`` stays unaware of it.
"""
