"""The Docker backend: hardened containers, the registry-free image, the in-container agent."""
