"""DeepXDE's `loss.dat`: a physics-informed network's losses, saved by `dde.saveplot`.

    # step, loss_train, loss_test, metrics_test
    0.000000000000000000e+00 1.46e+00 5.95e-02 1.14e+00 9.64e-01 1.56e-04 1.80e-01 1.54e-01
    1.000000000000000000e+03 6.72e-04 8.88e-04 4.86e-04 7.51e-05 1.93e-05 5.20e-06 4.20e-05

A row holds the step, then one value per loss term on the training points (a PDE's residuals,
each boundary and initial condition), the same terms on the test points, then the test metrics
(`np.savetxt` of the columns side by side, under that one header whatever their number). The
terms come twice, so of a row's `n` values after the step, `n - 2k` are metrics for `k` terms:
the metrics are taken to be one when `n` is odd (a relative L2 error, the usual one) and none
when it is even. The loss is the sum of the training terms, as DeepXDE minimises it and prints
it, each term a further series. The test terms are the same residuals on other points drawn
from the same domain, not held-out data: they are not read as an evaluation. Steps are
DeepXDE's iterations (an L-BFGS phase after Adam goes on counting, and may log a step twice
where it changes optimiser).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from trainguard.analyze.log import LOSS, LogBuilder, number

HEADER = re.compile(r"^#\s*step,\s*loss_train,\s*loss_test(?:,\s*metrics_test)?\s*$",
                    re.IGNORECASE)


def read_rows(lines: Iterable[str], log: LogBuilder) -> int:
    """Add one row per saved step to `log`; the number of rows (0 without DeepXDE's header)."""
    found = 0
    header = False
    for line in lines:
        if not line.strip():
            continue
        if not header:
            if HEADER.match(line.strip()) is None:
                return 0
            header = True
            continue
        read = [number(field) for field in line.split()]
        values = [v for v in read if v is not None]
        if len(values) < 3 or len(values) != len(read):
            continue
        step, *rest = values
        metrics = len(rest) % 2
        terms = (len(rest) - metrics) // 2
        if not terms or not math.isfinite(step) or not step.is_integer():
            continue
        train = rest[:terms]
        log.add(int(step), {LOSS: math.fsum(train),
                            **{f"loss_term_{i}": v for i, v in enumerate(train)}})
        found += 1
    return found
