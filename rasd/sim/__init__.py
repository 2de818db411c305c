"""Deterministic simulation of the mesh: ``Simulation`` runs many core nodes on a virtual network and clock."""

from .network import SimNode, Simulation

__all__ = ["SimNode", "Simulation"]
