package nccl

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Options say where to find the libraries. The zero value searches the standard places.
//
// Order of search, for each library: an explicit path (Options, then the environment
// variable) is used alone, so that a path that is set but wrong is an error rather than a
// silent fallback to another copy; otherwise the standard sonames through the dynamic linker
// (LD_LIBRARY_PATH, ld.so.cache, the binary's rpath), then the layout of NVIDIA's pip wheels
// (nvidia-nccl-cu12, nvidia-cuda-runtime-cu12, ...) in every Python site-packages directory
// known: Options.SitePackages, the one holding the TensorFlow this process has loaded, the
// active virtualenv (VIRTUAL_ENV), the active conda environment (CONDA_PREFIX), the Python
// installation of the first python3 on PATH (images such as NVIDIA's put a venv's or conda's
// bin on PATH without activating it), PYTHONPATH, and the system's Python directories.
type Options struct {
	RuntimePath  string   // libcudart; overrides GOROVOD_CUDART_LIBRARY
	LibraryPath  string   // libnccl; overrides GOROVOD_NCCL_LIBRARY
	SitePackages []string // extra site-packages directories, searched first among the wheels
}

// libSpec says how to find one library.
type libSpec struct {
	name    string
	envVar  string
	sonames []string
	wheels  []string // paths relative to a site-packages directory
}

var (
	ncclSpec = libSpec{
		name:    "NCCL",
		envVar:  "GOROVOD_NCCL_LIBRARY",
		sonames: []string{"libnccl.so.2", "libnccl.so"},
		wheels:  []string{"nvidia/nccl/lib/libnccl.so.2"},
	}
	runtimeSpec = libSpec{
		name:   "CUDA runtime",
		envVar: "GOROVOD_CUDART_LIBRARY",
		// 12 first: the TensorFlow GPU wheel gorovod pins depends on CUDA 12.
		sonames: []string{"libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so"},
		// nvidia-cuda-runtime-cu12 keeps one directory per component; the CUDA 13 wheels
		// share nvidia/cu13/lib.
		wheels: []string{"nvidia/cuda_runtime/lib/libcudart.so.12", "nvidia/cu13/lib/libcudart.so.13"},
	}
)

// candidate is one place to try.
type candidate struct {
	source string
	path   string
	file   bool // a file path (checked before dlopen) rather than a soname
}

// sitePackagesDir is a directory that may hold NVIDIA's wheels, and how it was found.
type sitePackagesDir struct {
	source string
	dir    string
}

// candidates lists the places to try for spec, in order.
func (s libSpec) candidates(explicit string, getenv func(string) string, sites []sitePackagesDir) []candidate {
	if explicit != "" {
		return []candidate{{source: "option", path: explicit, file: true}}
	}
	if p := getenv(s.envVar); p != "" {
		return []candidate{{source: s.envVar, path: p, file: true}}
	}
	var out []candidate
	for _, so := range s.sonames {
		out = append(out, candidate{source: "soname", path: so})
	}
	for _, site := range sites {
		for _, w := range s.wheels {
			out = append(out, candidate{source: "pip wheel in " + site.source, path: filepath.Join(site.dir, w), file: true})
		}
	}
	return out
}

// open tries every candidate in order.
func (s libSpec) open(cands []candidate) (*sharedLibrary, error) {
	notFound := &LibraryNotFoundError{Library: s.name}
	for _, c := range cands {
		if c.file {
			if _, err := os.Stat(c.path); err != nil {
				reason := err
				var pe *fs.PathError
				if errors.As(err, &pe) { // the path is printed beside the reason already
					reason = pe.Err
				}
				notFound.Tried = append(notFound.Tried, Attempt{c.source, c.path, reason.Error()})
				continue
			}
		}
		lib, err := dlopen(c.path)
		if err != nil {
			notFound.Tried = append(notFound.Tried, Attempt{c.source, c.path, err.Error()})
			continue
		}
		return lib, nil
	}
	return nil, notFound
}

// findSitePackages lists the site-packages directories to search, without duplicates.
// procMaps is the text of /proc/self/maps ("" when unreadable).
func findSitePackages(extra []string, getenv func(string) string, procMaps string) []sitePackagesDir {
	var out []sitePackagesDir
	seen := map[string]bool{}
	add := func(source string, dirs ...string) {
		for _, d := range dirs {
			d = filepath.Clean(d)
			if d == "." || seen[d] {
				continue
			}
			seen[d] = true
			out = append(out, sitePackagesDir{source, d})
		}
	}
	add("option", extra...)
	add("site-packages of the loaded TensorFlow", loadedTensorFlowSitePackages(procMaps)...)
	for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if prefix := getenv(v); prefix != "" {
			add(v, prefixSitePackages(prefix)...)
		}
	}
	source, sites := pathPythonSitePackages(getenv("PATH"))
	add(source, sites...)
	if pp := getenv("PYTHONPATH"); pp != "" {
		add("PYTHONPATH", filepath.SplitList(pp)...)
	}
	add("system Python",
		glob("/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
			"/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages")...)
	return out
}

// pathPythonSitePackages returns the site-packages of the Python installation holding the
// first python3 on path, and how it was found: a virtualenv (its prefix, the parent of bin/,
// has pyvenv.cfg), or else any prefix with lib/python3*/site-packages (a conda environment,
// pyenv, a Python built into /usr/local), which is where that python3 would import from
// (Python finds its own prefix from its executable's location the same way). When the first
// python3 belongs to neither it returns nothing: a later python3 on PATH is not the one a
// shell would run.
func pathPythonSitePackages(path string) (source string, sites []string) {
	python := firstOnPath(path, "python3")
	if python == "" {
		return "", nil
	}
	prefix := filepath.Dir(filepath.Dir(python))
	if _, err := os.Stat(filepath.Join(prefix, "pyvenv.cfg")); err == nil {
		return "virtualenv of python3 on PATH", prefixSitePackages(prefix)
	}
	return "prefix of python3 on PATH", prefixSitePackages(prefix)
}

// firstOnPath returns the absolute path of the program name that a shell would run from
// path: the first regular file with an execute bit, skipping directories and non-executable
// files of that name. As in a shell, an empty entry (a leading, trailing or doubled ':') and
// "." mean the current directory, and relative entries are taken from it.
func firstOnPath(path, name string) string {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		abs, err := filepath.Abs(dir)
		if err != nil { // no current directory: a relative entry names nothing
			continue
		}
		p := filepath.Join(abs, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// prefixSitePackages returns the site-packages directories of a Python prefix (a venv, a
// conda environment, an installation): prefix/lib/python3*/site-packages.
func prefixSitePackages(prefix string) []string {
	return glob(filepath.Join(escapeGlob(prefix), "lib", "python3*", "site-packages"))
}

// escapeGlob quotes the characters filepath.Match treats as special, so that a directory
// named, say, "env[gpu]" is matched literally rather than as a character class.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// loadedTensorFlowSitePackages finds the site-packages directory of the TensorFlow wheel whose
// C library this process has mapped (gorovod binaries link it from the wheel through
// third_party/tensorflow/lib): the GPU wheel's NVIDIA dependencies are installed beside it.
func loadedTensorFlowSitePackages(procMaps string) []string {
	sc := bufio.NewScanner(strings.NewReader(procMaps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		path := strings.Join(f[5:], " ")
		if strings.HasPrefix(filepath.Base(path), "libtensorflow_framework.so") {
			real, err := filepath.EvalSymlinks(path)
			if err != nil {
				real = path
			}
			// site-packages/tensorflow/libtensorflow_framework.so.2
			return []string{filepath.Dir(filepath.Dir(real))}
		}
	}
	return nil
}

func glob(patterns ...string) []string {
	var out []string
	for _, p := range patterns {
		m, _ := filepath.Glob(p) // well formed: constant, with any prefix escaped (escapeGlob)
		out = append(out, m...)
	}
	return out
}

// searchPlaces returns the candidates for spec in the running process.
func searchPlaces(spec libSpec, explicit string, opts Options) []candidate {
	maps, _ := os.ReadFile("/proc/self/maps") // absent off Linux: no TensorFlow hint
	return spec.candidates(explicit, os.Getenv, findSitePackages(opts.SitePackages, os.Getenv, string(maps)))
}
