"""The command line and what it shows: the top layer, the only one that imports all the others.

launch is the `evolver` entry point (it hands `evolver eval` to the warm zygote); commands/
parses the arguments and runs each command, one module per command or kin of commands; start begins or resumes a run; scaffold is
`evolver init`, and migrate its `--from` an auto-harness checkout or a Life-Harness command line;
settings_text renders the settings as evolver.toml's comments and docs/configuration.md's tables;
preflight sends each role's model one request before a command spends anything; compare is
`evolver compare` and `evolver transfer`; history reads and steers a run for `history`, `show`,
`status`, `runs` and `rollback`, and turns shows one of its simulations turn by turn (`show
--turns`); console renders to the terminal (tables, progress, the run's live ConsoleView);
runreport/ writes the HTML and markdown run report; tracking/ sends a run to MLflow.

Only evolver/__main__.py imports it.
"""
