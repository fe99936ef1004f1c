"""The meta-LLM's prompt templates and Harness.md, shipped inside the wheel as evolver.prompts."""
