"""mpbroker: a JMS-style STOMP 1.2 message broker for one host that scales by processes."""

__version__ = "0.1.0"
__all__ = ["__version__"]
