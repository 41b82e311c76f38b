"""Recurrent-cell ops."""

from __future__ import annotations
