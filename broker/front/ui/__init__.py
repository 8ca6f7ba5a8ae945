"""The operator dashboard served at ``/ui`` (see docs/dashboard.md)."""

from broker.front.ui.access import OperatorAccess
from broker.front.ui.api import Dashboard
from broker.front.ui.app import create_dashboard

__all__ = ["Dashboard", "OperatorAccess", "create_dashboard"]
