package main

import (
	"fmt"
	"strings"
)

// mpirunValueCounts is how many words follow each mpirun option that takes values (Open MPI
// 4.1's `mpirun --help all`, and Open MPI 5's MCA options and its --output and --display, which
// replace 4.1's --tag-output, --timestamp-output and --display-map), by name without its dashes: Open MPI
// takes one dash or two. Whatever gorovodrun puts after the user's mpirun words is the command,
// so an option missing its value would take the program's name as its value.
var mpirunValueCounts = map[string]int{
	"mca": 2, "gmca": 2, "prtemca": 2, "pmixmca": 2,
	"x": 1, "am": 1, "tune": 1, "app": 1,
	"np": 1, "n": 1, "c": 1, "N": 1, "npernode": 1, "npersocket": 1, "ppr": 1,
	"H": 1, "host": 1, "hostfile": 1, "machinefile": 1, "default-hostfile": 1, "rf": 1, "rankfile": 1,
	"bind-to": 1, "map-by": 1, "rank-by": 1, "cpu-list": 1, "cpu-set": 1, "cpus-per-proc": 1, "cpus-per-rank": 1,
	"output-filename": 1, "xml-file": 1, "stdin": 1, "report-pid": 1, "report-uri": 1, "report-events": 1,
	"wd": 1, "wdir": 1, "path": 1, "prefix": 1, "preload-files": 1, "launch-agent": 1, "personality": 1,
	"ompi-server": 1, "hnp": 1, "timeout": 1, "max-restarts": 1, "max-vm-size": 1, "cf": 1, "cartofile": 1,
	"debugger": 1, "xterm": 1, "output": 1, "display": 1, "stream-buffering": 1,
}

// mpirunOption is one option of an mpirun argument list: its name without dashes, as written,
// and its values.
type mpirunOption struct {
	name, word string
	values     []string
}

// parseMpirunArgs reads words (from --mpi-args or --binding-args, given as flag) as mpirun
// options with their values. Every word must be an option or one of its values, and the last
// option must have all of its values: mpirun reads the words gorovodrun puts after them, the
// command, as a value or as the program otherwise. -np 2 --mpi-args '--bind-to' prog would run
// `mpirun ... --bind-to prog` with no program.
func parseMpirunArgs(flag string, words []string) ([]mpirunOption, error) {
	var opts []mpirunOption
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") || w == "-" {
			return opts, fmt.Errorf("%s: %q is neither an mpirun option nor the value of one: mpirun would run it as the program, with the command as its arguments", flag, w)
		}
		opt := mpirunOption{name: strings.TrimLeft(w, "-"), word: w}
		n := mpirunValueCounts[opt.name]
		if i+n >= len(words) {
			return opts, fmt.Errorf("%s ends with %s, which takes %s: mpirun would read the command as the option's value",
				flag, w, plural(n, "value"))
		}
		opt.values = words[i+1 : i+1+n]
		i += n
		opts = append(opts, opt)
	}
	return opts, nil
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
