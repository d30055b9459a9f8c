"""The paper artifact's checks: claims (theses the runs must support) and the values the paper
prints. Above the simulator and the studies: nothing below imports this package."""
