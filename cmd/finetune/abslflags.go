package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// abslArgs rewrites the forms of absl's flags (run_classifier.py's parser) that Go's flag
// package lacks into ones it reads: --noNAME, for a boolean flag NAME, becomes --NAME=false, a
// boolean's value in any case (--do_train=TRue) becomes lower case, and
// --flagfile=FILE (or --flagfile FILE) is replaced by the flags of FILE, one a line, blank lines
// and lines starting with # or // skipped, a flagfile in it read in turn (readFlagfile). Arguments after -- are
// left alone, as absl leaves them.
func abslArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	return expandArgs(fs, args, nil)
}

// expandArgs is abslArgs within the flagfiles of reading (the chain that led here, to refuse
// a file that includes itself).
func expandArgs(fs *flag.FlagSet, args, reading []string) ([]string, error) {
	var out []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			return append(out, args[i:]...), nil
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "-") {
			out = append(out, arg)
			continue
		}
		switch {
		case name == "flagfile":
			if !hasValue {
				if i+1 == len(args) {
					return nil, fmt.Errorf("--flagfile needs a file: --flagfile=FILE")
				}
				i++
				value = args[i]
			}
			lines, err := readFlagfile(value, reading)
			if err != nil {
				return nil, err
			}
			expanded, err := expandArgs(fs, lines, append(reading, value))
			if err != nil {
				return nil, err
			}
			out = append(out, expanded...)
		case strings.HasPrefix(name, "no") && !hasValue && fs.Lookup(name) == nil && isBoolFlag(fs, name[2:]):
			out = append(out, "--"+name[2:]+"=false")
		case hasValue && isBoolFlag(fs, name) && isAbslBool(value):
			// absl reads a boolean's value in any case (tRUE), Go's flag package in three.
			out = append(out, "--"+name+"="+strings.ToLower(value))
		default:
			out = append(out, arg)
		}
	}
	return out, nil
}

// isAbslBool reports whether absl reads value as a boolean: true, t, 1, false, f or 0 in any case.
func isAbslBool(value string) bool {
	switch strings.ToLower(value) {
	case "true", "t", "1", "false", "f", "0":
		return true
	}
	return false
}

func isBoolFlag(fs *flag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// readFlagfile returns the flags of path ("~/" is the home directory, "" none, as absl reads
// them), one a line, trimmed; reading is the chain of flagfiles that includes it. absl ignores a
// flagfile that includes itself with a warning; here it is an error.
func readFlagfile(path string, reading []string) ([]string, error) {
	if path == "" {
		return nil, nil
	}
	if rest, ok := strings.CutPrefix(path, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			path = filepath.Join(home, rest)
		}
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("--flagfile %s: %w", path, err)
	}
	for _, r := range reading {
		if a, _ := filepath.Abs(r); a == abs {
			return nil, fmt.Errorf("--flagfile %s includes itself (through %s)", path, strings.Join(reading, " -> "))
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--flagfile: %w", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		// As absl: a comment starts the line; other lines are trimmed.
		raw := sc.Text()
		line := strings.TrimSpace(raw)
		if line == "" || strings.HasPrefix(raw, "#") || strings.HasPrefix(raw, "//") {
			continue
		}
		if !strings.HasPrefix(line, "-") {
			return nil, fmt.Errorf("--flagfile %s:%d: %q is not a flag (one --name=value a line)", path, n, line)
		}
		if isFlagfileLine(line) && !isFlagfileLine(raw) {
			// absl reads a flagfile line as one only from the line's first character: indented,
			// it is passed on as a flag, which run_classifier.py refuses as unknown.
			return nil, fmt.Errorf("--flagfile %s:%d: %q is indented: absl reads another flagfile only from a line's first character", path, n, line)
		}
		lines = append(lines, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--flagfile %s: %w", path, err)
	}
	return lines, nil
}

// isFlagfileLine is absl's test of a flagfile line naming another flagfile.
func isFlagfileLine(line string) bool {
	return strings.HasPrefix(line, "--flagfile=") || strings.HasPrefix(line, "-flagfile=")
}
