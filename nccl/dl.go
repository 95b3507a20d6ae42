package nccl

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>

// dlerror is per thread: the caller holds the OS thread (runtime.LockOSThread) between the
// failing call and this read.
static const char *gr_dlerror(void) { return dlerror(); }

// gr_dlpath is the file the dynamic linker loaded for h, NULL when it does not say.
static const char *gr_dlpath(void *h) {
	struct link_map *lm;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || lm->l_name == NULL || lm->l_name[0] == '\0') return NULL;
	return lm->l_name;
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// sharedLibrary is one dlopen'ed library.
type sharedLibrary struct {
	path   string // the file loaded, where a soname was asked for too
	handle unsafe.Pointer
}

// dlopen opens path (a file, or a soname resolved by the dynamic linker's usual search). The
// library's path is then the file the search found: which copy of a soname was loaded depends on
// LD_LIBRARY_PATH, the linker's cache and the binary's rpath, and an error must name it.
func dlopen(path string) (*sharedLibrary, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h := C.dlopen(cpath, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return nil, fmt.Errorf("%s", C.GoString(C.gr_dlerror()))
	}
	if file := C.gr_dlpath(h); file != nil {
		path = C.GoString(file)
	}
	return &sharedLibrary{path: path, handle: h}, nil
}

// symbol returns the address of name, or a *SymbolNotFoundError.
func (l *sharedLibrary) symbol(name string) (unsafe.Pointer, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	p := C.dlsym(l.handle, cname)
	if p == nil {
		return nil, &SymbolNotFoundError{Library: l.path, Symbol: name}
	}
	return p, nil
}

// symbolSlot is where one required symbol's address goes.
type symbolSlot struct {
	name string
	addr *unsafe.Pointer
}

// symbols resolves every slot in order, naming the first symbol missing.
func (l *sharedLibrary) symbols(slots []symbolSlot) error {
	for _, s := range slots {
		p, err := l.symbol(s.name)
		if err != nil {
			return err
		}
		*s.addr = p
	}
	return nil
}

func (l *sharedLibrary) close() { C.dlclose(l.handle) }
