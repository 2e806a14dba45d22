"""Names for the numpy array types the daemon passes between its modules."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: Vectors, embeddings and term frequencies.
F32 = npt.NDArray[np.float32]
