"""torchras's app layer: what ties ``rasd`` and ``inprocess`` together for a user (``rasd launch``).

DESIGN.md section 2: the app layer may import both packages, and neither imports it. The ``rasd`` console script
enters here (``torchras.cli``), so ``rasd launch`` lives above both while ``rasd.cli`` stays unaware of it.
"""
