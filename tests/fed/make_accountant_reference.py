#!/usr/bin/env python3
"""Regenerates the reference epsilons in tests/fed/test_accountant.cpp.

They come from Google's dp-accounting package (PyPI `dp-accounting`, version
0.6.0), the RDP accountant with its default orders and add-or-remove-one
neighbours:

    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(z)), rounds)
    acc.get_epsilon(delta)

Usage:  python3 -m venv /work/venv-dp && /work/venv-dp/bin/pip install dp-accounting==0.6.0
        /work/venv-dp/bin/python tests/fed/make_accountant_reference.py
It prints one C++ initialiser line per case, to paste into kReference.
"""
import importlib.metadata

import dp_accounting
from absl import logging

# (q, z, rounds, delta): full participation, small and large sampling rates,
# weak and strong noise, few and many rounds; the fractional orders win some.
CASES = [
    (1.0, 1.0, 1, 1e-5),
    (1.0, 1.1, 10, 1e-5),
    (1.0, 5.0, 100, 1e-6),
    (0.5, 1.0, 5, 1e-5),
    (0.1, 1.1, 100, 1e-5),
    (0.01, 1.1, 1000, 1e-5),
    (0.2, 0.8, 30, 1e-5),
    (0.05, 2.0, 200, 1e-6),
    (0.3, 0.5, 3, 1e-3),
    (0.001, 0.6, 10000, 1e-5),
    (0.25, 1.3, 7, 1e-5),
]


def main():
    # dp-accounting warns of each fractional order whose series does not converge (it leaves them out).
    logging.set_verbosity(logging.ERROR)
    print(f"// dp-accounting {importlib.metadata.version('dp-accounting')}")
    for q, z, rounds, delta in CASES:
        acc = dp_accounting.rdp.RdpAccountant()
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
        acc.compose(event, rounds)
        eps, order = acc.get_epsilon_and_optimal_order(delta)
        print(f"    {{{q!r}, {z!r}, {rounds}, {delta!r}, {float(eps)!r}}},  // order {float(order)}")


if __name__ == "__main__":
    main()
