"""Running commands, for every tool that starts them (the table runner, the GPU report): one command
streamed into its log (``command``), and the machine commands side by side share (``machine``)."""
