"""The embedded local model: provisioning, the llama.cpp server, and its serving path."""
