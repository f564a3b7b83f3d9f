"""The sweep as a person writes it: the parameter grammar (`sweepspec`), `--search` and
`--prune` options (`searchspec`), W&B sweep files (`sweepfile`), and the checked plan
storage keeps (`sweepplan`). Pure but for reading a sweep file."""
