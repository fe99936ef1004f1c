"""The command line and what it shows: the top layer, the only one that imports all the others.

launch is the `evolver` entry point (it hands `evolver eval` to the warm zygote); commands/
parses the arguments and runs each command, one module per command or kin of commands; start begins or resumes a run; scaffold is
`evolver init`; history reads and steers a run for `history`, `show`, `status`, `runs` and
`rollback`; console renders to the terminal (tables, progress, the run's live ConsoleView);
runreport/ writes the HTML and markdown run report; tracking/ sends a run to MLflow.
"""
