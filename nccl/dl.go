package nccl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

// dlerror is per thread: the caller holds the OS thread (runtime.LockOSThread) between the
// failing call and this read.
static const char *gr_dlerror(void) { return dlerror(); }
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// sharedLibrary is one dlopen'ed library.
type sharedLibrary struct {
	path   string
	handle unsafe.Pointer
}

// dlopen opens path (a file, or a soname resolved by the dynamic linker's usual search).
func dlopen(path string) (*sharedLibrary, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h := C.dlopen(cpath, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return nil, fmt.Errorf("%s", C.GoString(C.gr_dlerror()))
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
