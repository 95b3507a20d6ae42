package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"unicode"
)

// host is one machine of the job and how many ranks it may run.
type host struct {
	name  string
	slots int
}

// hostList writes hosts the way mpirun's -H takes them: name:slots,name:slots.
func hostList(hosts []host) string {
	parts := make([]string, len(hosts))
	for i, h := range hosts {
		parts[i] = h.name + ":" + strconv.Itoa(h.slots)
	}
	return strings.Join(parts, ",")
}

func totalSlots(hosts []host) int {
	n := 0
	for _, h := range hosts {
		n += h.slots
	}
	return n
}

// parseHosts reads horovodrun's -H value, HOST:SLOTS[,HOST:SLOTS...]. The slots follow the last
// colon, so an IPv6 address keeps its own. An error names the bad item.
func parseHosts(spec string) ([]host, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, fmt.Errorf("empty host list: want HOST:SLOTS[,HOST:SLOTS...]")
	}
	var hosts []host
	for _, item := range strings.Split(spec, ",") {
		i := strings.LastIndexByte(item, ':')
		if i < 0 {
			return nil, fmt.Errorf("%q: want HOST:SLOTS (horovodrun's form: the slots are not optional)", item)
		}
		h, err := newHost(item[:i], item[i+1:])
		if err != nil {
			return nil, fmt.Errorf("%q: %v", item, err)
		}
		hosts = append(hosts, h)
	}
	return hosts, checkDuplicates(hosts)
}

// parseHostfile reads horovodrun's (and OpenMPI's) host file: one `HOST slots=N` a line; blank
// lines and # comments are skipped. An error names the line.
func parseHostfile(path string) ([]host, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var hosts []host
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		bad := func(why string) error {
			return fmt.Errorf("line %d: %q: %s", line, strings.TrimSpace(text), why)
		}
		if len(fields) != 2 || !strings.HasPrefix(fields[1], "slots=") {
			return nil, bad("want `HOST slots=N`")
		}
		h, err := newHost(fields[0], strings.TrimPrefix(fields[1], "slots="))
		if err != nil {
			return nil, bad(err.Error())
		}
		hosts = append(hosts, h)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("no hosts in it: want one `HOST slots=N` a line")
	}
	return hosts, checkDuplicates(hosts)
}

func newHost(name, slots string) (host, error) {
	// The name travels in mpirun's -H, where a comma ends it, and may come from or go to a host
	// file, where a blank ends it, a newline ends the line and # starts a comment; a control
	// character (NUL among them, which no argument can hold) names no machine.
	if name == "" || strings.ContainsAny(name, ",#") || strings.IndexFunc(name, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}) >= 0 {
		return host{}, fmt.Errorf("bad host name %q", name)
	}
	// Open MPI counts a node's slots in an int32: a larger count is misread by mpirun, and
	// wraps around the job's total slots here.
	n, err := strconv.Atoi(slots)
	if err != nil || n < 1 || n > math.MaxInt32 {
		return host{}, fmt.Errorf("slots %q: want an integer from 1 to %d", slots, math.MaxInt32)
	}
	return host{name: name, slots: n}, nil
}

// checkDuplicates refuses a host named twice: mpirun would merge the two entries' slots, which is
// rarely what a typo meant.
func checkDuplicates(hosts []host) error {
	seen := make(map[string]bool, len(hosts))
	for _, h := range hosts {
		if seen[h.name] {
			return fmt.Errorf("host %q is listed twice: give it once with all its slots", h.name)
		}
		seen[h.name] = true
	}
	return nil
}
