"""The broker's processes: the nsqd command, the supervisor and each child it forks, their event loop, the shared
Plan."""
