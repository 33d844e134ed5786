"""Small notebooks for the notebook tests (local and on Ray)."""

from __future__ import annotations

import json
from pathlib import Path

NOTEBOOK_OK = ["x = 1", "print('result', x * 2)"]
NOTEBOOK_BAD = ["x = 1", "raise ValueError(f'bad x {x}')"]


def write_notebook(path: Path, cells: list[str]) -> Path:
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "id": f"c{i}",
                "metadata": {"tags": ["parameters"]} if i == 0 else {},
                "source": src,
                "outputs": [],
                "execution_count": None,
            }
            for i, src in enumerate(cells)
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return path
