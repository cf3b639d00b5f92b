//go:build unix && !linux

package servers

import "syscall"

// ChildAttr returns the process attributes of a child process. cred, when
// not nil, runs it as another user; with newGroup the child gets its own
// process group, so a Ctrl-C in the terminal reaches only the parent. Only
// Linux can also have the kernel kill the child when the parent dies.
func ChildAttr(cred *syscall.Credential, newGroup bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: newGroup}
}
