"""The bottom layer: what every other package may use and which uses none of them.

Device facts (`hardware`: GPU name and count, nominal peaks, machine description), NVTX
ranges (`nvtx`) and the command-line help formatter (`cli_help`).
"""
