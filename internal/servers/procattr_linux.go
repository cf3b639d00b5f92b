package servers

import "syscall"

// ChildAttr returns the process attributes of a child that must not outlive
// this process: on Linux the kernel sends it SIGKILL when its parent dies.
// cred, when not nil, runs it as another user. With newGroup the child gets
// its own process group, so a Ctrl-C in the terminal reaches only the
// parent, which then stops the child itself.
func ChildAttr(cred *syscall.Credential, newGroup bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL, Setpgid: newGroup}
}
