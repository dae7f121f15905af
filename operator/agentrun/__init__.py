"""agentrun: durable AI agent workflows as Kubernetes custom resources."""

__version__ = "0.1.0"
