package nccl

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// isolate clears every variable discovery reads, so the machine's own settings do not leak in.
func isolate(t *testing.T) {
	for _, v := range []string{"GOROVOD_NCCL_LIBRARY", "GOROVOD_CUDART_LIBRARY", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH"} {
		t.Setenv(v, "")
	}
}

// installedSystemWide reports whether the dynamic linker finds one of spec's sonames, in which
// case discovery legitimately stops there and the wheel fallbacks cannot be observed.
func installedSystemWide(spec libSpec) bool {
	for _, so := range spec.sonames {
		if l, err := dlopen(so); err == nil {
			l.close()
			return true
		}
	}
	return false
}

func TestCandidatesOrder(t *testing.T) {
	sites := []sitePackagesDir{{"option", "/a"}, {"VIRTUAL_ENV", "/b"}}
	noEnv := func(string) string { return "" }
	var got []string
	for _, c := range runtimeSpec.candidates("", noEnv, sites) {
		got = append(got, c.source+"="+c.path)
	}
	want := []string{
		"soname=libcudart.so.12", "soname=libcudart.so.13", "soname=libcudart.so.11.0", "soname=libcudart.so",
		"pip wheel in option=/a/nvidia/cuda_runtime/lib/libcudart.so.12",
		"pip wheel in option=/a/nvidia/cu13/lib/libcudart.so.13",
		"pip wheel in VIRTUAL_ENV=/b/nvidia/cuda_runtime/lib/libcudart.so.12",
		"pip wheel in VIRTUAL_ENV=/b/nvidia/cu13/lib/libcudart.so.13",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("candidates:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// An explicit path is used alone; the option wins over the environment variable.
	env := func(k string) string {
		if k == "GOROVOD_NCCL_LIBRARY" {
			return "/env/libnccl.so.2"
		}
		return ""
	}
	if c := ncclSpec.candidates("", env, sites); len(c) != 1 || c[0].path != "/env/libnccl.so.2" || c[0].source != "GOROVOD_NCCL_LIBRARY" {
		t.Errorf("env candidates = %+v", c)
	}
	if c := ncclSpec.candidates("/opt/libnccl.so.2", env, sites); len(c) != 1 || c[0].path != "/opt/libnccl.so.2" || c[0].source != "option" {
		t.Errorf("option candidates = %+v", c)
	}
}

func TestFindSitePackagesOrderAndDedup(t *testing.T) {
	root := t.TempDir()
	venvSite := filepath.Join(root, "venv", "lib", "python3.11", "site-packages")
	condaSite := filepath.Join(root, "conda", "lib", "python3.10", "site-packages")
	pathVenvSite := filepath.Join(root, "pathvenv", "lib", "python3.12", "site-packages")
	tfSite := filepath.Join(root, "tfsite")
	for _, d := range []string{venvSite, condaSite, pathVenvSite, filepath.Join(tfSite, "tensorflow"), filepath.Join(root, "pathvenv", "bin"), filepath.Join(root, "plain")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tfLib := filepath.Join(tfSite, "tensorflow", "libtensorflow_framework.so.2")
	for _, f := range []string{tfLib, filepath.Join(root, "pathvenv", "pyvenv.cfg")} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeExecutable(t, filepath.Join(root, "pathvenv", "bin", "python3"))
	// gorovod binaries map TensorFlow through the third_party/tensorflow/lib symlink.
	link := filepath.Join(root, "libtensorflow_framework.so.2")
	if err := os.Symlink(tfLib, link); err != nil {
		t.Fatal(err)
	}
	maps := "7f0000000000-7f0000001000 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n" +
		"7f0000002000-7f0000003000 r-xp 00000000 08:01 456 " + link + "\n"
	env := map[string]string{
		"VIRTUAL_ENV":  filepath.Join(root, "venv"),
		"CONDA_PREFIX": filepath.Join(root, "conda"),
		"PYTHONPATH":   filepath.Join(root, "pp") + ":" + venvSite, // venvSite again: deduplicated
		// The first python3 on PATH is in a venv that is not activated; "plain" has none.
		"PATH": filepath.Join(root, "plain") + "::" + filepath.Join(root, "pathvenv", "bin") + ":/usr/bin",
	}
	got := findSitePackages([]string{filepath.Join(root, "opt")}, func(k string) string { return env[k] }, maps)
	want := []sitePackagesDir{
		{"option", filepath.Join(root, "opt")},
		{"site-packages of the loaded TensorFlow", tfSite},
		{"VIRTUAL_ENV", venvSite},
		{"CONDA_PREFIX", condaSite},
		{"virtualenv of python3 on PATH", pathVenvSite},
		{"PYTHONPATH", filepath.Join(root, "pp")},
	}
	if len(got) < len(want) {
		t.Fatalf("got %+v, want prefix %+v", got, want)
	}
	for i, w := range want {
		if got[i] != w {
			t.Errorf("site %d = %+v, want %+v", i, got[i], w)
		}
	}
	for _, s := range got[len(want):] {
		if s.source != "system Python" || s.dir == venvSite {
			t.Errorf("unexpected extra site %+v", s)
		}
	}
	// A mapped path that no longer resolves is taken as it is.
	gone := "7f00-7f01 r-xp 0 0:0 1 /gone/site/tensorflow/libtensorflow_framework.so.2\n"
	if l := loadedTensorFlowSitePackages(gone); len(l) != 1 || l[0] != "/gone/site" {
		t.Errorf("unresolvable path: got %v", l)
	}
	// The first python3 on PATH decides: one outside any Python prefix hides a venv's later
	// on PATH.
	writeExecutable(t, filepath.Join(root, "plain", "python3"))
	if src, l := pathPythonSitePackages(env["PATH"]); l != nil {
		t.Errorf("python3 outside a Python prefix first on PATH: got %s %v", src, l)
	}
	if l := loadedTensorFlowSitePackages("garbage\n\n"); l != nil {
		t.Errorf("no TensorFlow mapped: got %v", l)
	}
}

// writeExecutable writes an empty file with execute permission (a stand-in for python3).
func writeExecutable(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o755); err != nil {
		t.Fatal(err)
	}
}

// pythonPrefix makes a Python prefix under root: bin/python3 and lib/<version>/site-packages,
// with pyvenv.cfg when venv is set. It returns the site-packages directory.
func pythonPrefix(t *testing.T, prefix, version string, venv bool) string {
	t.Helper()
	site := filepath.Join(prefix, "lib", version, "site-packages")
	if err := os.MkdirAll(site, 0o755); err != nil {
		t.Fatal(err)
	}
	writeExecutable(t, filepath.Join(prefix, "bin", "python3"))
	if venv {
		if err := os.WriteFile(filepath.Join(prefix, "pyvenv.cfg"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return site
}

// TestPythonOnPathIsTheOneAShellRuns checks that the python3 whose site-packages are searched
// is the one a shell would run from PATH, and how its installation is recognised.
func TestPythonOnPathIsTheOneAShellRuns(t *testing.T) {
	root := t.TempDir()
	venvSite := pythonPrefix(t, filepath.Join(root, "venv"), "python3.11", true)
	condaSite := pythonPrefix(t, filepath.Join(root, "conda"), "python3.10", false)
	// Named python3 but not something a shell runs: a directory, and a file without an
	// execute bit, each in what would otherwise be a venv.
	pythonPrefix(t, filepath.Join(root, "dirpy"), "python3.9", true)
	if err := os.Remove(filepath.Join(root, "dirpy", "bin", "python3")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "dirpy", "bin", "python3"), 0o755); err != nil {
		t.Fatal(err)
	}
	pythonPrefix(t, filepath.Join(root, "noexec"), "python3.9", true)
	if err := os.Chmod(filepath.Join(root, "noexec", "bin", "python3"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A venv's bin/python3 is a symlink to the base interpreter: the link's directory, not its
	// target's, names the venv.
	linked := filepath.Join(root, "linkvenv")
	linkedSite := pythonPrefix(t, linked, "python3.12", true)
	if err := os.Remove(filepath.Join(linked, "bin", "python3")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "conda", "bin", "python3"), filepath.Join(linked, "bin", "python3")); err != nil {
		t.Fatal(err)
	}
	bin := func(prefix string) string { return filepath.Join(root, prefix, "bin") }
	const venv, prefix = "virtualenv of python3 on PATH", "prefix of python3 on PATH"
	for _, c := range []struct {
		name, cwd, path string
		source          string
		site            string
	}{
		{"venv", root, bin("venv"), venv, venvSite},
		{"conda prefix without pyvenv.cfg", root, bin("conda") + ":" + bin("venv"), prefix, condaSite},
		{"directory named python3 skipped", root, bin("dirpy") + ":" + bin("venv"), venv, venvSite},
		{"non-executable python3 skipped", root, bin("noexec") + ":" + bin("conda"), prefix, condaSite},
		{"symlinked python3", root, bin("linkvenv"), venv, linkedSite},
		{"relative entry from the current directory", root, "/nonexistent:venv/bin", venv, venvSite},
		{"dot is the current directory", bin("conda"), ".:" + bin("venv"), prefix, condaSite},
		{"leading empty entry is the current directory", bin("conda"), ":" + bin("venv"), prefix, condaSite},
		{"doubled colon is the current directory", bin("venv"), "/nonexistent::" + bin("conda"), venv, venvSite},
		{"trailing empty entry is the current directory", bin("venv"), "/nonexistent:", venv, venvSite},
		{"no python3", root, "/nonexistent:" + root, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Chdir(c.cwd)
			source, sites := pathPythonSitePackages(c.path)
			var want []string
			if c.site != "" {
				want = []string{c.site}
			}
			if source != c.source || strings.Join(sites, ",") != strings.Join(want, ",") {
				t.Errorf("PATH=%q in %s: got %q %v, want %q %v", c.path, c.cwd, source, sites, c.source, want)
			}
		})
	}
}

// TestPrefixesAreNotGlobPatterns checks that a prefix containing glob metacharacters names
// itself: "env[1]" as a pattern would match a sibling "env1" and never itself.
func TestPrefixesAreNotGlobPatterns(t *testing.T) {
	root := t.TempDir()
	odd := filepath.Join(root, "env[1]*?")
	site := pythonPrefix(t, odd, "python3.11", true)
	pythonPrefix(t, filepath.Join(root, "env1xy"), "python3.9", true) // what the pattern would match
	for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		env := map[string]string{v: odd}
		got := findSitePackages(nil, func(k string) string { return env[k] }, "")
		if len(got) == 0 || got[0] != (sitePackagesDir{v, site}) {
			t.Errorf("%s=%s: got %+v, want %s first", v, odd, got, site)
		}
	}
	if src, sites := pathPythonSitePackages(filepath.Join(odd, "bin")); src != "virtualenv of python3 on PATH" || len(sites) != 1 || sites[0] != site {
		t.Errorf("python3 in %s: got %q %v", odd, src, sites)
	}
}

func TestLoadRuntimeNotFoundListsEveryPlace(t *testing.T) {
	isolate(t)
	if installedSystemWide(runtimeSpec) {
		t.Skip("a CUDA runtime is installed system-wide here; the not-found path is tested where it is not")
	}
	root := t.TempDir()
	venvSite := filepath.Join(root, "venv", "lib", "python3.12", "site-packages")
	if err := os.MkdirAll(venvSite, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIRTUAL_ENV", filepath.Join(root, "venv"))
	t.Setenv("PYTHONPATH", filepath.Join(root, "pp"))
	_, err := LoadRuntime(Options{SitePackages: []string{filepath.Join(root, "opt")}})
	var nf *LibraryNotFoundError
	if !errors.As(err, &nf) {
		t.Fatalf("err = %v, want *LibraryNotFoundError", err)
	}
	if nf.Library != "CUDA runtime" {
		t.Errorf("Library = %q", nf.Library)
	}
	msg := err.Error()
	wantInOrder := []string{
		"soname: libcudart.so.12:", "soname: libcudart.so.13:", "soname: libcudart.so.11.0:", "soname: libcudart.so:",
		"pip wheel in option: " + filepath.Join(root, "opt", "nvidia/cuda_runtime/lib/libcudart.so.12") + ": ",
		"pip wheel in VIRTUAL_ENV: " + filepath.Join(venvSite, "nvidia/cuda_runtime/lib/libcudart.so.12") + ": ",
		"pip wheel in VIRTUAL_ENV: " + filepath.Join(venvSite, "nvidia/cu13/lib/libcudart.so.13") + ": ",
		"pip wheel in PYTHONPATH: " + filepath.Join(root, "pp", "nvidia/cuda_runtime/lib/libcudart.so.12") + ": ",
	}
	pos := 0
	for _, w := range wantInOrder {
		i := strings.Index(msg[pos:], w)
		if i < 0 {
			t.Fatalf("error does not list %q (in order) in:\n%s", w, msg)
		}
		pos += i + len(w)
	}
	for _, a := range nf.Tried {
		if a.Err == "" {
			t.Errorf("attempt %+v has no reason", a)
		}
	}
	if !strings.Contains(msg, "no such file") {
		t.Errorf("wheel attempts should say the file is missing:\n%s", msg)
	}
}

func TestLoadFromWheelLayout(t *testing.T) {
	isolate(t)
	site := filepath.Join(t.TempDir(), "venv", "lib", "python3.11", "site-packages")
	cudart := filepath.Join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so.12")
	nccl := filepath.Join(site, "nvidia", "nccl", "lib", "libnccl.so.2")
	for src, dst := range map[string]string{fakeLib(t, "cuda"): cudart, fakeLib(t, "nccl"): nccl} {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("VIRTUAL_ENV", filepath.Dir(filepath.Dir(filepath.Dir(site))))
	rt, err := LoadRuntime(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !installedSystemWide(runtimeSpec) && rt.Path() != cudart {
		t.Errorf("runtime loaded from %s, want the wheel's %s", rt.Path(), cudart)
	}
	lib, err := Load(rt, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !installedSystemWide(ncclSpec) && lib.Path() != nccl {
		t.Errorf("NCCL loaded from %s, want the wheel's %s", lib.Path(), nccl)
	}
}

func TestExplicitPathIsUsedAlone(t *testing.T) {
	isolate(t)
	t.Setenv("GOROVOD_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
	rt := fakeRuntime(t, "1")
	_, err := Load(rt, Options{})
	var nf *LibraryNotFoundError
	if !errors.As(err, &nf) || len(nf.Tried) != 1 || nf.Tried[0].Source != "GOROVOD_NCCL_LIBRARY" {
		t.Fatalf("err = %v, want one attempt from GOROVOD_NCCL_LIBRARY", err)
	}
	// The option overrides the environment variable.
	lib, err := Load(rt, Options{LibraryPath: fakeLib(t, "nccl")})
	if err != nil {
		t.Fatal(err)
	}
	if lib.Path() != fakeLib(t, "nccl") || lib.Runtime() != rt {
		t.Errorf("Path = %s", lib.Path())
	}
	// The environment variable names the CUDA runtime too.
	t.Setenv("GOROVOD_CUDART_LIBRARY", fakeLib(t, "cuda"))
	if rt, err := LoadRuntime(Options{}); err != nil || rt.Path() != fakeLib(t, "cuda") {
		t.Errorf("LoadRuntime via GOROVOD_CUDART_LIBRARY: %v", err)
	}
}

func TestNotASharedLibrary(t *testing.T) {
	isolate(t)
	bogus := filepath.Join(t.TempDir(), "libcudart.so.12")
	if err := os.WriteFile(bogus, []byte("not an ELF file"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := LoadRuntime(Options{RuntimePath: bogus})
	var nf *LibraryNotFoundError
	if !errors.As(err, &nf) || len(nf.Tried) != 1 {
		t.Fatalf("err = %v", err)
	}
	// The reason is the dynamic linker's own message.
	if !strings.Contains(nf.Tried[0].Err, bogus) {
		t.Errorf("reason %q does not come from dlerror", nf.Tried[0].Err)
	}
}

func TestMissingSymbol(t *testing.T) {
	isolate(t)
	_, err := LoadRuntime(Options{RuntimePath: fakeLib(t, "cuda-omit")})
	var se *SymbolNotFoundError
	if !errors.As(err, &se) || se.Symbol != "cudaDeviceGetPCIBusId" || se.Library != fakeLib(t, "cuda-omit") {
		t.Fatalf("err = %v, want the missing cudaDeviceGetPCIBusId", err)
	}
	_, err = Load(fakeRuntime(t, "1"), Options{LibraryPath: fakeLib(t, "nccl-omit")})
	if !errors.As(err, &se) || se.Symbol != "ncclAllGather" {
		t.Fatalf("err = %v, want the missing ncclAllGather", err)
	}
	if !strings.Contains(err.Error(), "has no symbol ncclAllGather") {
		t.Errorf("message: %v", err)
	}
	if _, err := Load(nil, Options{}); err == nil {
		t.Error("Load(nil runtime) succeeded")
	}
}

// soNameDirEnv is set in the child process of TestLoadedBySonameNamesTheFile: the directory
// its LD_LIBRARY_PATH starts with.
const soNameDirEnv = "NCCL_TEST_SONAME_DIR"

// A library found by soname is named by the file the dynamic linker chose (LD_LIBRARY_PATH, its
// cache or the rpath decide which), in Path and in a missing symbol's error: "libnccl.so.2 has no
// symbol" did not say which of the machine's copies is too old.
func TestLoadedBySonameNamesTheFile(t *testing.T) {
	if dir := os.Getenv(soNameDirEnv); dir != "" {
		// The child: LD_LIBRARY_PATH, read by the dynamic linker at start-up, leads to dir.
		isolate(t)
		rt, err := LoadRuntime(Options{})
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(dir, "libcudart.so.12"); rt.Path() != want {
			t.Errorf("runtime Path() = %q, want %q", rt.Path(), want)
		}
		_, err = Load(rt, Options{})
		var se *SymbolNotFoundError
		if want := filepath.Join(dir, "libnccl.so.2"); !errors.As(err, &se) || se.Library != want || !strings.Contains(err.Error(), want+" has no symbol") {
			t.Errorf("err = %v, want the missing symbol of %s", err, want)
		}
		return
	}
	dir := t.TempDir()
	for src, dst := range map[string]string{fakeLib(t, "cuda"): "libcudart.so.12", fakeLib(t, "nccl-omit"): "libnccl.so.2"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLoadedBySonameNamesTheFile$", "-test.v")
	cmd.Env = append(os.Environ(), soNameDirEnv+"="+dir, "LD_LIBRARY_PATH="+dir+":"+os.Getenv("LD_LIBRARY_PATH"), "FAKE_CUDA_DEVICES=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
