pub struct X;
