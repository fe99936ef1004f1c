"""Every text the meta-LLM is sent, a folder per proposer, and Harness.md, the guide: shipped inside the wheel as
evolver.prompts and read by evolver.evolution.proposers.prompts."""
